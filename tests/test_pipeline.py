"""The compiled pipeline (parsed YAML), its command line, and a whole local run through kfp.local."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.pipelines import IMAGE, pipeline_spec, run_cli, run_script

EXECUTORS = {
    "exec-prepare-data",
    "exec-create-cluster",
    "exec-train-worker",
    "exec-evaluate",
    "exec-publish-model",
    "exec-deploy-model",
}


def _load(path):
    """The pipeline spec: the first YAML document (the second is the Kubernetes platform config)."""
    return next(yaml.safe_load_all(Path(path).read_text()))


def _tasks(spec):
    """Every task of every DAG in the spec (root, loops, conditions), by task name."""
    found = dict(spec["root"]["dag"]["tasks"])
    for component in spec["components"].values():
        found.update(component.get("dag", {}).get("tasks", {}))
    return found


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    path = tmp_path_factory.mktemp("compiled") / "pipeline.yaml"
    result = run_script("--compile", "--output", str(path), "--image", IMAGE)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def spec(compiled):
    return _load(compiled)


@pytest.fixture(scope="module")
def platform(compiled):
    return list(yaml.safe_load_all(compiled.read_text()))[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_yaml_loads_back_with_kfp(compiled):
    from kfp import components

    loaded = components.load_component_from_file(str(compiled))
    assert loaded.name == "mnist-multiworker"
    assert set(loaded.component_spec.inputs) >= {"num_workers", "epochs", "source", "max_restarts"}
    assert set(loaded.component_spec.outputs) == {"accuracy", "serving_check", "model", "metrics", "report"}


def test_every_step_runs_in_the_given_image_without_pip_install(spec):
    executors = spec["deploymentSpec"]["executors"]
    assert set(executors) == EXECUTORS
    for executor in executors.values():
        container = executor["container"]
        assert container["image"] == IMAGE
        command = " ".join(container.get("command", []) + container.get("args", []))
        assert "pip install" not in command and "kfp==" not in command and "kfp.dsl.executor_main" in command


def test_workers_fan_out_over_create_clusters_indices_and_all_run_at_once(spec):
    tasks = _tasks(spec)
    ((loop_key, loop),) = [(k, t) for k, t in tasks.items() if "parameterIterator" in t]
    assert loop["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--create-cluster-Output"
    assert "iteratorPolicy" not in loop, "every worker must run at once: no parallelism limit"
    inner = spec["components"][loop["componentRef"]["name"]]["dag"]["tasks"]["train-worker"]
    assert inner["inputs"]["parameters"]["worker_index"]["componentInputParameter"].endswith("loop-item")
    assert tasks["create-cluster"]["inputs"]["parameters"]["num_workers"] == {"componentInputParameter": "num_workers"}
    assert tasks["evaluate"]["inputs"]["artifacts"]["models"]["taskOutputArtifact"]["producerTask"] == loop_key
    assert loop["taskInfo"]["name"] == "workers"


def test_no_exit_handler_and_the_run_returns_its_results(spec):
    assert not any("exit-handler" in name for name in spec["components"])
    assert all(
        t.get("triggerPolicy", {}).get("strategy") != "ALL_UPSTREAM_TASKS_COMPLETED" for t in _tasks(spec).values()
    )
    outputs = spec["root"]["dag"]["outputs"]
    assert outputs["parameters"]["accuracy"]["valueFromParameter"]["producerSubtask"] == "evaluate"
    assert {a: v["artifactSelectors"][0]["outputArtifactKey"] for a, v in outputs["artifacts"].items()} == {
        "model": "chief_model",
        "metrics": "metrics",
        "report": "report",
    }


def _guards(spec, task_name):
    """The conditions of every dsl.If around a task, outermost first."""
    parents = {}
    for name, component in spec["components"].items():
        for child in component.get("dag", {}).get("tasks", {}).values():
            parents[child["componentRef"]["name"]] = name
    tasks = _tasks(spec)
    component, guards = tasks[task_name]["componentRef"]["name"], []
    while component in parents:
        component = parents[component]
        owner = next(t for t in tasks.values() if t["componentRef"]["name"] == component)
        guards.insert(0, owner.get("triggerPolicy", {}).get("condition"))
    return guards


def test_quality_gate_and_serving_check_guard_publishing_and_deploying(spec):
    value = "inputs.parameter_values['pipelinechannel--{}']".format
    gates = [f"{value('evaluate-Output')} == 'publish'", f"{value('publish_uri')} != ''"]
    assert _guards(spec, "publish-model") == gates
    assert _guards(spec, "deploy-model") == [*gates, f"{value('serving_name')} != ''"]
    tasks = _tasks(spec)
    assert (
        tasks["publish-model"]["inputs"]["artifacts"]["model"]["componentInputArtifact"]
        == "pipelinechannel--evaluate-chief_model"
    )
    decision = tasks["deploy-model"]["inputs"]["artifacts"]["decision"]
    assert decision == {"componentInputArtifact": "pipelinechannel--publish-model-decision"}, "after publishing"


def test_only_data_preparation_is_cached(spec):
    tasks = _tasks(spec)
    assert tasks["prepare-data"]["cachingOptions"] == {"enableCache": True}
    for name in ("create-cluster", "train-worker", "evaluate", "publish-model", "deploy-model"):
        assert not tasks[name]["cachingOptions"].get("enableCache"), name


def test_data_that_changes_behind_its_source_can_be_prepared_again_in_every_run(capsys, tmp_path):
    out = tmp_path / "fresh.yaml"
    result = run_cli(capsys, "--compile", "--image", IMAGE, "--no-cache-data", "--output", str(out))
    assert result.returncode == 0, result.stderr
    tasks = _tasks(pipeline_spec(out))
    assert not tasks["prepare-data"]["cachingOptions"].get("enableCache")


def test_evaluate_outputs_are_types_the_ui_renders(spec):
    outputs = spec["components"]["comp-evaluate"]["outputDefinitions"]["artifacts"]
    assert outputs["metrics"]["artifactType"]["schemaTitle"] == "system.Metrics"
    assert outputs["classification_metrics"]["artifactType"]["schemaTitle"] == "system.ClassificationMetrics"
    assert outputs["report"]["artifactType"]["schemaTitle"] == "system.HTML"


def test_every_parameter_and_input_has_a_description(spec):
    root = spec["root"]["inputDefinitions"]["parameters"]
    assert all(p.get("description") for p in root.values()), [n for n, p in root.items() if not p.get("description")]
    worker = spec["components"]["comp-train-worker"]["inputDefinitions"]
    assert "index in the cluster" in worker["parameters"]["worker_index"]["description"]
    assert all(a.get("description") for a in worker["artifacts"].values())


def test_training_pods_know_who_they_are_and_what_they_may_use(spec, platform):
    worker = platform["exec-train-worker"]
    assert {(e["name"], e["fieldPath"]) for e in worker["fieldPathAsEnv"]} == {
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("POD_IP", "status.podIP"),
    }
    # No deadline the user did not choose: a long training is never cut by a default (PodSettings.timeout_seconds).
    assert "activeDeadlineSeconds" not in worker
    resources = spec["deploymentSpec"]["executors"]["exec-train-worker"]["container"]["resources"]
    assert (
        resources["cpuRequest"] == 1.0
        and resources["cpuLimit"] == 2.0
        and resources["memoryLimit"] > resources["memoryRequest"]
    )
    assert _tasks(spec)["train-worker"]["retryPolicy"]["maxRetryCount"] == 1
    for executor in ("exec-create-cluster", "exec-deploy-model"):
        assert platform[executor]["fieldPathAsEnv"] == [{"name": "POD_NAMESPACE", "fieldPath": "metadata.namespace"}]


def test_pod_sizing_comes_from_the_command_line(tmp_path, capsys):
    result = run_cli(
        capsys,
        "--compile",
        "--image",
        IMAGE,
        "--output",
        str(tmp_path / "p.yaml"),
        "--cpu-request",
        "500m",
        "--memory-limit",
        "8Gi",
        "--retries",
        "0",
        "--timeout-seconds",
        "3600",
    )
    assert result.returncode == 0, result.stderr
    spec, platform = list(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    resources = spec["deploymentSpec"]["executors"]["exec-train-worker"]["container"]["resources"]
    assert resources["cpuRequest"] == 0.5 and resources["memoryLimit"] == 8.589934592
    assert "retryPolicy" not in _tasks(spec)["train-worker"]
    assert (
        int(
            platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train-worker"][
                "activeDeadlineSeconds"
            ]
        )
        == 3600
    )


def _help(capsys, *argv):
    from pipelines import cli

    with pytest.raises(SystemExit) if argv else contextlib.nullcontext():
        code = cli.main([*argv, "--help"])
        assert code == 0
    return capsys.readouterr().out


def test_each_action_shows_only_its_own_options(capsys):
    compile_help = _help(capsys, "--compile")
    local_help = _help(capsys, "--local")
    server_help = _help(capsys, "--upload")
    assert "--image" in compile_help and "--cpu-request" in compile_help and "--num-workers" not in compile_help
    assert "--num-workers" in local_help and "--image" not in local_help and "--host" not in local_help
    assert "--host" in server_help and "--param" not in server_help and "--max-concurrency" not in server_help
    assert "--max-concurrency" in _help(capsys, "--every", "1h")
    top = _help(capsys)
    assert "--compile " in top and "--image IMAGE" not in top


def test_kfp_cli_compiles_the_file_with_the_image_from_the_environment(tmp_path):
    kfp_cli = Path(sys.executable).parent / "kfp"
    argv = [str(kfp_cli), "dsl", "compile", "--py", "pipelines/mnist.py", "--output", str(tmp_path / "k.yaml")]
    refused = subprocess.run(
        argv,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "KFP_TF_IMAGE"},
    )
    assert refused.returncode != 0 and "error: $KFP_TF_IMAGE is not set" in refused.stderr
    assert not (tmp_path / "k.yaml").exists()
    result = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ, KFP_TF_IMAGE=IMAGE)
    )
    assert result.returncode == 0, result.stderr
    compiled = _load(tmp_path / "k.yaml")
    assert compiled["pipelineInfo"]["name"] == "mnist-multiworker"
    assert {e["container"]["image"] for e in compiled["deploymentSpec"]["executors"].values()} == {IMAGE}
    for strategy, name in (("parameter_server", "mnist-parameter-server"), ("ring", None)):
        env = dict(os.environ, KFP_TF_IMAGE=IMAGE, KFP_TF_STRATEGY=strategy)
        (tmp_path / "k.yaml").unlink(missing_ok=True)
        chosen = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        if name:
            assert chosen.returncode == 0 and _load(tmp_path / "k.yaml")["pipelineInfo"]["name"] == name
        else:
            assert chosen.returncode != 0 and not (tmp_path / "k.yaml").exists()
            assert (
                "error: $KFP_TF_STRATEGY: strategy 'ring' is not allowed; allowed: multi_worker_mirrored, "
                "parameter_server" in chosen.stderr
            )


def test_an_image_without_a_registry_is_taken_with_a_warning(tmp_path, capsys):
    result = run_cli(capsys, "--compile", "--image", "kfp-tf-multiworker:0.1.0", "--output", str(tmp_path / "p.yaml"))
    assert result.returncode == 0, result.stderr
    assert (
        "image 'kfp-tf-multiworker:0.1.0' names no registry, so a cluster pulls it from "
        "docker.io/library/kfp-tf-multiworker" in result.stderr
    )


def test_parameter_server_pipeline_has_its_own_name_chief_ps_and_worker_ops(tmp_path, capsys):
    result = run_cli(
        capsys, "--compile", "--strategy", "parameter_server", "--output", str(tmp_path / "ps.yaml"), "--image", IMAGE
    )
    assert result.returncode == 0, result.stderr
    ps_spec = _load(tmp_path / "ps.yaml")
    assert ps_spec["pipelineInfo"]["name"] == "mnist-parameter-server"
    executors = ps_spec["deploymentSpec"]["executors"]
    assert {"exec-train-chief", "exec-train-server", "exec-create-ps-cluster"} <= set(executors)
    assert "exec-train-worker" not in executors
    params = ps_spec["root"]["inputDefinitions"]["parameters"]
    assert params["num_ps"]["defaultValue"] == 1 and params["status_uri"]["defaultValue"] == ""
    tasks = _tasks(ps_spec)
    loops = {t["taskInfo"]["name"]: t for t in tasks.values() if "parameterIterator" in t}
    assert (
        loops["parameter servers and workers"]["parameterIterator"]["items"]["inputParameter"]
        == "pipelinechannel--create-ps-cluster-Output"
    )
    assert loops["chief"]["parameterIterator"]["items"]["raw"] == "[0]"


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_every_pod_of_both_strategies_carries_the_istio_label_and_training_pods_their_name(tmp_path, capsys, strategy):
    path = tmp_path / f"{strategy}.yaml"
    result = run_cli(capsys, "--compile", "--strategy", strategy, "--output", str(path), "--image", IMAGE)
    assert result.returncode == 0, result.stderr
    docs = list(yaml.safe_load_all(path.read_text()))
    executors = set(docs[0]["deploymentSpec"]["executors"])
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(platform) == executors, "every step's pod has platform settings"
    for name in executors:
        labels = platform[name].get("podMetadata", {}).get("labels", {})
        assert labels.get("sidecar.istio.io/inject") == "false", name
        training = name in ("exec-train-worker", "exec-train-chief", "exec-train-server")
        assert (labels.get("app.kubernetes.io/name") == "kfp-tf-multiworker") == training, name


def test_pod_settings_take_every_quantity_kubernetes_takes_and_refuse_a_request_above_its_limit():
    from pipelines.pods import PodSettings
    from trainer.core.errors import UsageError

    pods = PodSettings(cpu_request="0.5", cpu_limit="1500m", memory_request="1.5Gi", memory_limit="1e10")
    assert (pods.cpu_request, pods.cpu_limit, pods.memory_request, pods.memory_limit) == (
        "500m",
        "1500m",
        str(3 * 2**29),
        "10000000000",
    )
    unlimited = PodSettings(cpu_request="4", cpu_limit="", memory_request="8Gi", memory_limit="")
    assert (unlimited.cpu_limit, unlimited.memory_limit) == ("", "")
    with pytest.raises(UsageError, match=r"^cpu_request '4' is above cpu_limit '2'; Kubernetes rejects such a pod"):
        PodSettings(cpu_request="4", cpu_limit="2")
    with pytest.raises(UsageError, match=r"^memory_limit '4GB' is not allowed; allowed: a Kubernetes quantity"):
        PodSettings(memory_limit="4GB")
    with pytest.raises(UsageError, match=r"^timeout -1s is not allowed; allowed: 0 \(none\) or a number of seconds"):
        PodSettings(timeout_seconds=-1)
