"""The components that receive loop items and collected artifacts, run through KFP's own executor exactly as the
compiled YAML tells a pod to (its `sh -ec ... python3 -m kfp.dsl.executor_main` command), with executor inputs whose
values are typed the way the YAML types them, as the backend's driver would hand them over.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.pipelines import pipeline_spec

WORKER_PARAMETERS = {
    "worker_index": 0,
    "run_id": "run-1",
    "model_fn": "",
    "epochs": 1,
    "batch_size": 64,
    "learning_rate": 0.002,
    "startup_timeout": 60.0,
    "unschedulable_timeout": 60.0,
    "collective_timeout": 0.0,
    "max_restarts": 0,
    "checkpoint_dir": "",
    "checkpoint_claim": "",
    "tensorboard_dir": "",
    "cluster_mode": "local",
}
JSON_TYPES = {
    "NUMBER_INTEGER": int,
    "NUMBER_DOUBLE": float,
    "STRING": str,
    "BOOLEAN": bool,
    "LIST": list,
    "STRUCT": dict,
}


@pytest.fixture(scope="module")
def spec(compiled_yaml):
    return pipeline_spec(compiled_yaml["multi_worker_mirrored"])


def _artifact(path, schema, name="a", metadata=None):
    return {"name": name, "uri": str(path), "metadata": metadata or {}, "type": {"schemaTitle": schema}}


def run_executor(spec, component, parameters, inputs, outputs, workdir):
    """Runs the component's compiled command with an executor input; returns (process, executor output or None)."""
    definitions = spec["components"][f"comp-{component.replace('_', '-')}"]
    declared = definitions["inputDefinitions"].get("parameters", {})
    for name, value in parameters.items():
        assert type(value) is JSON_TYPES[declared[name]["parameterType"]], f"{name} typed as the YAML declares it"
    output_file = Path(workdir) / "executor_output.json"
    executor_input = {
        "inputs": {"parameterValues": parameters, "artifacts": {k: {"artifacts": v} for k, v in inputs.items()}},
        "outputs": {
            "artifacts": {k: {"artifacts": [v]} for k, v in outputs.items()},
            "parameters": {
                k: {"outputFile": str(Path(workdir) / k)}
                for k in definitions.get("outputDefinitions", {}).get("parameters", {})
            },
            "outputFile": str(output_file),
        },
    }
    container = spec["deploymentSpec"]["executors"][f"exec-{component.replace('_', '-')}"]["container"]
    argv = [a.replace("{{$}}", json.dumps(executor_input)) for a in container["command"] + container["args"]]
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    env.pop("TF_CONFIG", None)
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=workdir)
    return result, json.loads(output_file.read_text()) if output_file.exists() else None


def _create_cluster(spec, tmp_path, num_workers):
    """create_cluster through KFP's executor; its cluster artifact goes to TMP_PATH/cluster."""
    parameters = {"run_id": "run-1", "num_workers": num_workers, "cluster_mode": "local", "port": 2222}
    cluster = _artifact(tmp_path / "cluster", "system.Artifact", "cluster")
    return run_executor(spec, "create_cluster", parameters, {}, {"cluster": cluster}, tmp_path)


def test_create_cluster_returns_integer_worker_indices(spec, tmp_path):
    result, out = _create_cluster(spec, tmp_path, num_workers=2)
    assert result.returncode == 0, result.stderr[-2000:]
    assert out["parameterValues"]["Output"] == [0, 1]
    assert all(type(i) is int for i in out["parameterValues"]["Output"]), "numbers, as the NUMBER_INTEGER loop item"
    record = json.loads((tmp_path / "cluster" / "cluster.json").read_text())
    assert len(record["cluster"]["worker"]) == 2 and len(record["control"]["worker"]) == 2


@pytest.mark.slow
def test_a_worker_takes_its_index_as_the_driver_delivers_it_and_evaluate_takes_the_collected_models(
    spec, sample_data, tmp_path
):
    result, _ = _create_cluster(spec, tmp_path, num_workers=1)
    assert result.returncode == 0, result.stderr[-2000:]
    worker_inputs = {
        "dataset": [_artifact(sample_data, "system.Dataset", "dataset")],
        "cluster": [_artifact(tmp_path / "cluster", "system.Artifact", "cluster")],
    }
    parameters = dict(WORKER_PARAMETERS)
    stringly = dict(parameters, worker_index="0")
    with pytest.raises(AssertionError, match="worker_index typed as the YAML declares it"):
        run_executor(spec, "train_worker", stringly, worker_inputs, {}, tmp_path)

    model = _artifact(tmp_path / "model-0", "system.Model", "model")
    result, out = run_executor(spec, "train_worker", parameters, worker_inputs, {"model": model}, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert out["artifacts"]["model"]["artifacts"][0]["metadata"]["chief"] is True
    assert (tmp_path / "model-0" / "saved_model" / "saved_model.pb").is_file()

    other = tmp_path / "model-1"
    other.mkdir()
    (other / "worker.json").write_text('{"worker_index": 1, "chief": false}')
    models = [_artifact(tmp_path / "model-0", "system.Model", "model"), _artifact(other, "system.Model", "model")]
    outputs = {
        name: _artifact(tmp_path / name, schema, name)
        for name, schema in (
            ("metrics", "system.Metrics"),
            ("classification_metrics", "system.ClassificationMetrics"),
            ("report", "system.HTML"),
            ("chief_model", "system.Model"),
        )
    }
    result, out = run_executor(
        spec,
        "evaluate",
        {"min_accuracy": 0.5, "gate": ""},
        {"dataset": worker_inputs["dataset"], "models": models},
        outputs,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = out["parameterValues"]["accuracy"]
    metrics = out["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert 0.5 <= accuracy <= 1 and metrics["passed_gate"] == 1 and metrics["serving_check_passed"] == 1
    assert out["parameterValues"]["serving_check"] == "passed"
    assert out["parameterValues"]["Output"] == "publish", "the string the gate's condition compares"
    assert out["artifacts"]["chief_model"]["artifacts"][0]["metadata"]["source_uri"] == str(tmp_path / "model-0")
    assert (tmp_path / "report").read_text().startswith("<!doctype html>")


def test_a_worker_given_the_index_as_text_fails_with_one_line_as_bad_input(spec, sample_data, tmp_path):
    """What the old YAML's STRING loop item would have done, had the driver let it through."""
    result, _ = _create_cluster(spec, tmp_path, num_workers=1)
    assert result.returncode == 0, result.stderr[-2000:]
    spec = yaml.safe_load(yaml.safe_dump(spec))
    spec["components"]["comp-train-worker"]["inputDefinitions"]["parameters"]["worker_index"]["parameterType"] = (
        "STRING"
    )
    parameters = dict(WORKER_PARAMETERS, worker_index="0")
    result, _ = run_executor(
        spec,
        "train_worker",
        parameters,
        {
            "dataset": [_artifact(sample_data, "system.Dataset", "dataset")],
            "cluster": [_artifact(tmp_path / "cluster", "system.Artifact", "cluster")],
        },
        {"model": _artifact(tmp_path / "model", "system.Model", "model")},
        tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: task index '0' must be an integer"
    ]
    assert not (tmp_path / "model").exists()
