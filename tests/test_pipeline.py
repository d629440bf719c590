"""The compiled pipeline (parsed YAML) and a whole local run through kfp.local."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

IMAGE = "registry.example/team/kfp-tf-multiworker:9.9.9"
COMPONENTS = {"comp-prepare-data", "comp-create-cluster", "comp-train-worker", "comp-evaluate"}
EXECUTORS = {"exec-prepare-data", "exec-create-cluster", "exec-train-worker", "exec-evaluate", "exec-publish-model", "exec-delete-cluster"}


def _load(path):
    """The pipeline spec: the first YAML document (the second is the Kubernetes platform config)."""
    return next(yaml.safe_load_all(Path(path).read_text()))


def _tasks(spec):
    """Every task of every DAG in the spec (root, exit handler, loop, conditions), by task name."""
    found = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        found.update(component.get("dag", {}).get("tasks", {}))
    return found


def _script(*args, timeout=600):
    return subprocess.run([sys.executable, "pipelines/mnist.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
    result = _script("--compile", "--output", str(path), "--image", IMAGE)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def spec(compiled):
    return _load(compiled)


def test_yaml_loads_back_with_kfp(compiled):
    from kfp import components

    loaded = components.load_component_from_file(str(compiled))
    assert loaded.name == "mnist-multiworker"
    assert set(loaded.component_spec.inputs) >= {"num_workers", "epochs", "source"}


def test_four_components_all_in_the_given_image_without_pip_install(spec):
    assert set(spec["components"]) >= COMPONENTS
    executors = spec["deploymentSpec"]["executors"]
    assert set(executors) == EXECUTORS, "the four steps, the publish step behind the gate, the cleanup step"
    for executor in executors.values():
        container = executor["container"]
        assert container["image"] == IMAGE
        command = " ".join(container.get("command", []) + container.get("args", []))
        assert "pip install" not in command and "kfp==" not in command
        assert "kfp.dsl.executor_main" in command


def test_default_image_matches_the_package_version(tmp_path):
    from trainer import __version__

    result = _script("--compile", "--output", str(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.stderr
    images = {e["container"]["image"] for e in _load(tmp_path / "p.yaml")["deploymentSpec"]["executors"].values()}
    assert images == {f"kfp-tf-multiworker:{__version__}"}


def test_parallel_for_over_the_cluster_driven_by_num_workers(spec):
    tasks = _tasks(spec)
    loops = [t for t in tasks.values() if "parameterIterator" in t]
    assert len(loops) == 1
    loop = loops[0]
    assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--create-cluster-Output"
    assert "iteratorPolicy" not in loop, "every worker must run at once: no parallelism limit"
    loop_component = spec["components"][loop["componentRef"]["name"]]
    inner = loop_component["dag"]["tasks"]["train-worker"]
    assert inner["componentRef"]["name"] == "comp-train-worker"
    assert inner["inputs"]["parameters"]["worker_index"]["componentInputParameter"].endswith("loop-item")
    assert tasks["create-cluster"]["inputs"]["parameters"]["num_workers"] == {"componentInputParameter": "pipelinechannel--num_workers"}
    assert spec["root"]["dag"]["tasks"]["exit-handler-1"]["inputs"]["parameters"]["pipelinechannel--num_workers"] == {
        "componentInputParameter": "num_workers"}
    assert tasks["evaluate"]["inputs"]["artifacts"]["models"]["taskOutputArtifact"]["producerTask"] == loop["taskInfo"]["name"]


def test_quality_gate_guards_publishing(spec):
    tasks = _tasks(spec)
    gates = [t for t in tasks.values() if "triggerPolicy" in t and "condition" in t["triggerPolicy"]]
    conditions = " ".join(g["triggerPolicy"]["condition"] for g in gates)
    assert "inputs.parameter_values['pipelinechannel--evaluate-Output'] >= inputs.parameter_values['pipelinechannel--min_accuracy']" in conditions
    assert "inputs.parameter_values['pipelinechannel--publish_uri'] != ''" in conditions
    assert tasks["publish-model"]["inputs"]["artifacts"]["model"]["componentInputArtifact"] == "pipelinechannel--evaluate-chief_model"


def test_parameters_and_defaults(spec):
    params = spec["root"]["inputDefinitions"]["parameters"]
    defaults = {name: p.get("defaultValue") for name, p in params.items()}
    assert defaults["source"] == "tfds:mnist"
    assert defaults["num_workers"] == 2 and params["num_workers"]["parameterType"] == "NUMBER_INTEGER"
    assert defaults["epochs"] == 12 and defaults["batch_size"] == 64
    assert defaults["learning_rate"] == 0.002 and params["learning_rate"]["parameterType"] == "NUMBER_DOUBLE"
    assert defaults["cluster_mode"] == "kubernetes"


def test_caching_decided_at_compile_time(spec, tmp_path):
    tasks = _tasks(spec)
    assert tasks["prepare-data"]["cachingOptions"] == {"enableCache": True}
    assert not tasks["evaluate"]["cachingOptions"].get("enableCache")
    assert not tasks["create-cluster"]["cachingOptions"].get("enableCache")
    assert not tasks["train-worker"]["cachingOptions"].get("enableCache")
    assert not tasks["publish-model"]["cachingOptions"].get("enableCache")
    assert _script("--compile", "--cache-training", "--output", str(tmp_path / "c.yaml")).returncode == 0
    cached = _tasks(_load(tmp_path / "c.yaml"))
    assert cached["evaluate"]["cachingOptions"] == {"enableCache": True}
    assert cached["train-worker"]["cachingOptions"] == {"enableCache": True}


def test_evaluate_outputs_are_types_the_ui_renders(spec):
    outputs = spec["components"]["comp-evaluate"]["outputDefinitions"]["artifacts"]
    assert outputs["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert outputs["classification_metrics"]["artifactType"]["schemaTitle"] == "system.ClassificationMetrics"
    assert outputs["report"]["artifactType"]["schemaTitle"] == "system.HTML"


def test_docstrings_become_descriptions(spec):
    inputs = spec["components"]["comp-train-worker"]["inputDefinitions"]
    assert "index in the cluster" in inputs["parameters"]["worker_index"]["description"]


def test_kfp_cli_compiles_the_file_too(tmp_path):
    kfp_cli = Path(sys.executable).parent / "kfp"
    result = subprocess.run([str(kfp_cli), "dsl", "compile", "--py", "pipelines/mnist.py", "--output", str(tmp_path / "k.yaml")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert _load(tmp_path / "k.yaml")["pipelineInfo"]["name"] == "mnist-multiworker"


def test_compile_refuses_a_non_yaml_output(tmp_path):
    result = _script("--compile", "--output", str(tmp_path / "p.json"))
    assert result.returncode == 2
    assert "must end with .yaml or .yml" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_local_run_with_three_workers_is_refused_at_once(tmp_path):
    start = time.monotonic()
    result = _script("--local", "--num-workers", "3", "--output-dir", str(tmp_path / "run"), timeout=60)
    assert result.returncode == 2
    assert "--num-workers 3 is not allowed with --local; allowed: 1 to 2" in result.stderr
    assert "at most 2 ParallelFor iterations at once" in result.stderr
    assert time.monotonic() - start < 30
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_local_pipeline_end_to_end(tmp_path):
    published = tmp_path / "published"
    result = _script("--local", "--num-workers", "2", "--output-dir", str(tmp_path / "run"), "--publish-uri", str(published))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    printed = re.search(r"^test accuracy: ([0-9.]+)$", result.stdout, re.M)
    assert printed, result.stdout[-2000:]
    accuracy = float(printed.group(1))
    assert accuracy == summary["accuracy"] >= 0.96
    run_dir = Path(summary["run"])
    names = sorted(p.name for p in run_dir.iterdir())
    loops = [n for n in names if "-iteration-" in n]
    assert sorted(set(names) - set(loops)) == ["create-cluster", "delete-cluster", "evaluate", "prepare-data", "publish-model"]
    assert len(loops) == 2 and loops[0].endswith("-iteration-0") and loops[1].endswith("-iteration-1")
    model = Path(summary["model"])
    assert (model / "saved_model" / "saved_model.pb").is_file()
    history = json.loads((model / "history.json").read_text())
    assert history["workers"] == 2, "both workers trained together in one MultiWorkerMirroredStrategy cluster"
    other = run_dir / loops[1] / "train-worker" / "model"
    assert sorted(p.name for p in other.iterdir()) == ["worker.json"]

    out = json.loads((run_dir / "evaluate" / "executor_output.json").read_text())
    assert out["parameterValues"]["Output"] == accuracy
    assert out["artifacts"]["metrics"]["artifacts"][0]["metadata"]["accuracy"] == accuracy
    matrix = out["artifacts"]["classification_metrics"]["artifacts"][0]["metadata"]["confusionMatrix"]
    assert [a["displayName"] for a in matrix["annotationSpecs"]] == [str(d) for d in range(10)]
    assert sum(sum(r["row"]) for r in matrix["rows"]) == 1000
    report = Path(summary["report"]).read_text()
    assert report.startswith("<!doctype html>") and "data:image/png;base64," in report
    assert f"Test accuracy {accuracy:.4f}" in report

    latest = json.loads((published / "latest.json").read_text())
    version_dir = published / str(latest["version"])
    assert sorted(p.name for p in published.iterdir()) == sorted([str(latest["version"]), "latest.json"])
    assert (version_dir / "saved_model.pb").is_file()
    assert json.loads((version_dir / "metrics.json").read_text())["metrics"]["accuracy"] == accuracy
    assert latest["lineage"]["dataset"] == "sample" and latest["lineage"]["parameters"]["num_workers"] == 2
    assert latest["lineage"]["run_id"]

    worse = _script("--local", "--num-workers", "2", "--epochs", "1", "--min-accuracy", "0.5", "--output-dir", str(tmp_path / "run2"),
                    "--publish-uri", str(published))
    assert worse.returncode == 0, worse.stderr[-3000:]
    worse_accuracy = json.loads(worse.stdout.strip().splitlines()[-1])["accuracy"]
    assert 0.5 <= worse_accuracy < accuracy
    assert f"not published: accuracy {worse_accuracy:.4f} is below the published version {latest['version']}" in worse.stdout
    assert json.loads((published / "latest.json").read_text()) == latest, "a worse model does not replace the published one"
    assert sorted(p.name for p in published.iterdir()) == sorted([str(latest["version"]), "latest.json"])


@pytest.mark.slow
def test_failed_quality_gate_publishes_nothing_and_the_run_succeeds(tmp_path):
    result = _script("--local", "--num-workers", "2", "--epochs", "1", "--min-accuracy", "0.999", "--output-dir", str(tmp_path / "run"),
                     "--publish-uri", str(tmp_path / "published"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["accuracy"] < 0.999 and "publish" not in summary
    assert not (tmp_path / "published").exists()
    out = json.loads((Path(summary["run"]) / "evaluate" / "executor_output.json").read_text())
    assert out["artifacts"]["metrics"]["artifacts"][0]["metadata"]["passed_gate"] == 0
    assert "FAILED, not published" in Path(summary["report"]).read_text()


def test_parameter_server_pipeline_has_chief_ps_and_worker_ops(tmp_path, spec):
    result = _script("--compile", "--strategy", "parameter_server", "--output", str(tmp_path / "ps.yaml"), "--image", IMAGE)
    assert result.returncode == 0, result.stderr
    ps_spec = _load(tmp_path / "ps.yaml")
    executors = ps_spec["deploymentSpec"]["executors"]
    assert {"exec-train-chief", "exec-train-server"} <= set(executors) and "exec-train-worker" not in executors
    assert {e["container"]["image"] for e in executors.values()} == {IMAGE}
    params = ps_spec["root"]["inputDefinitions"]["parameters"]
    assert params["num_ps"]["defaultValue"] == 1 and "status_uri" in params and "defaultValue" not in params["status_uri"]
    tasks = _tasks(ps_spec)
    assert tasks["create-cluster"]["inputs"]["parameters"]["num_ps"] == {"componentInputParameter": "pipelinechannel--num_ps"}
    loops = {t["taskInfo"]["name"]: t for t in tasks.values() if "parameterIterator" in t}
    assert loops["parameter servers and workers"]["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--create-cluster-Output"
    assert loops["chief"]["parameterIterator"]["items"]["raw"] == "[0]"
    assert tasks["evaluate"]["inputs"]["artifacts"]["models"]["taskOutputArtifact"]["producerTask"] == next(
        name for name, t in tasks.items() if t["taskInfo"]["name"] == "chief")
    server_inputs = ps_spec["components"]["comp-train-server"]["inputDefinitions"]["parameters"]
    assert "ps:0" in server_inputs["task"]["description"]
    # the default stays the mirrored pipeline
    assert "exec-train-chief" not in spec["deploymentSpec"]["executors"] and "num_ps" not in spec["root"]["inputDefinitions"]["parameters"]


def test_local_parameter_server_run_is_refused_with_the_reason(tmp_path):
    result = _script("--local", "--strategy", "parameter_server", "--output-dir", str(tmp_path / "run"), timeout=60)
    assert result.returncode == 2
    assert "--strategy parameter_server is not allowed with --local: kfp.local runs at most 2 ops at once" in result.stderr
    assert not (tmp_path / "run").exists()
