"""Every component body through `python_func`, with real artifacts in temporary directories (no KFP runner)."""

import json
import re
import threading

import pytest
from kfp.dsl import HTML, Artifact, ClassificationMetrics, Dataset, Markdown, Metrics, Model

import components
from trainer.core.runs import run_key

OPS = components.build("registry.example.com/team/kfp-tf-multiworker:9.9.9")


def _run(component, **kwargs):
    return getattr(OPS, component).python_func(**kwargs)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    dataset = Dataset(uri=str(tmp_path_factory.mktemp("prepared") / "dataset"))
    _run("prepare_data", dataset=dataset, source="sample", max_train_examples=1200, max_test_examples=300, num_shards=2)
    return dataset


def test_prepare_data_records_the_counts(small_data):
    assert small_data.metadata == {"source": "sample", "train_examples": 1200, "test_examples": 300, "num_classes": 10}
    assert json.loads(open(f"{small_data.path}/metadata.json").read())["splits"]["train"]["num_examples"] == 1200


def test_prepare_data_refuses_a_bad_source_with_exit_2(tmp_path, capsys):
    dataset = Dataset(uri=str(tmp_path / "dataset"))
    with pytest.raises(SystemExit) as exit_info:
        _run("prepare_data", dataset=dataset, source="ftp://x", max_train_examples=0, max_test_examples=0, num_shards=4)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: source 'ftp://x' is not allowed")
    assert not (tmp_path / "dataset").exists()


def test_a_server_step_refuses_a_task_that_is_not_type_colon_index_with_exit_2(tmp_path, capsys):
    inputs = {"dataset": Dataset(uri=str(tmp_path / "d")), "cluster": Artifact(uri=str(tmp_path / "cluster"))}
    settings = {"run_id": "run-8", "status_uri": "", "storage": "", "s3_endpoint": "", "cluster_mode": "local"}
    timeouts = {"startup_timeout": 1.0, "unschedulable_timeout": 1.0, "chief_timeout": 1.0}
    with pytest.raises(SystemExit) as exit_info:
        _run("train_server", task="ps-0", **inputs, **settings, **timeouts)
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "error: task 'ps-0' is not TYPE:INDEX; allowed: a task such as 'worker:1' or 'ps:0'"


def test_create_cluster_variants_give_typed_items_and_a_cluster_file(tmp_path):
    cluster = Artifact(uri=str(tmp_path / "mirrored"))
    assert _run("create_cluster", cluster=cluster, run_id="r", num_workers=3, cluster_mode="local", port=2222) == [
        0,
        1,
        2,
    ]
    assert len(cluster.metadata["cluster"]["worker"]) == 3 and cluster.metadata["mode"] == "local"
    ps_cluster = Artifact(uri=str(tmp_path / "ps"))
    tasks = _run(
        "create_ps_cluster", cluster=ps_cluster, run_id="r", num_workers=2, num_ps=1, cluster_mode="local", port=2222
    )
    assert tasks == ["worker:0", "worker:1", "ps:0"]
    spec = json.loads((tmp_path / "ps" / "cluster.json").read_text())["cluster"]
    assert {job: len(a) for job, a in spec.items()} == {"chief": 1, "worker": 2, "ps": 1}


@pytest.mark.slow
def test_train_evaluate_and_publish_bodies(small_data, tmp_path):
    cluster = Artifact(uri=str(tmp_path / "cluster"))
    _run("create_cluster", cluster=cluster, run_id="run-7", num_workers=1, cluster_mode="local", port=2222)
    model = Model(uri=str(tmp_path / "model"))
    _run(
        "train_worker",
        dataset=small_data,
        cluster=cluster,
        worker_index=0,
        model=model,
        run_id="run-7",
        epochs=2,
        batch_size=64,
        learning_rate=0.002,
        startup_timeout=60.0,
        unschedulable_timeout=60.0,
        collective_timeout=0.0,
        max_restarts=0,
        checkpoint_dir="",
        tensorboard_dir=str(tmp_path / "tb"),
        cluster_mode="local",
    )
    assert model.metadata == {
        "task": "worker:0",
        "chief": True,
        "strategy": "multi_worker_mirrored",
        "framework": "tensorflow",
    }
    history = json.loads((tmp_path / "model" / "history.json").read_text())
    assert history["run_id"] == "run-7" and history["parameters"]["epochs"] == 2

    outputs = {
        "metrics": Metrics(uri=str(tmp_path / "metrics")),
        "report": HTML(uri=str(tmp_path / "report")),
        "classification_metrics": ClassificationMetrics(uri=str(tmp_path / "cm")),
        "chief_model": Model(uri=str(tmp_path / "chief")),
    }
    decision, accuracy, serving_check = _run(
        "evaluate", dataset=small_data, models=[model], min_accuracy=0.5, **outputs
    )
    assert (
        outputs["metrics"].metadata["accuracy"] == accuracy >= 0.5 and outputs["metrics"].metadata["passed_gate"] == 1
    )
    assert serving_check == "passed" and outputs["metrics"].metadata["serving_check_passed"] == 1
    assert decision == "publish" == outputs["report"].metadata["decision"]
    assert outputs["chief_model"].metadata["serving_check"].startswith("passed: 256 held-out uint8 images")
    report = (tmp_path / "report").read_text()
    assert "Serving check: <b>passed</b>" in report and f'<a href="file://{tmp_path}/tb/run-7">' in report
    charts = re.findall(r"<svg .*?</svg>", report, re.S)
    assert [re.search(r"<title>(.*?)</title>", c).group(1) for c in charts] == ["training loss", "training accuracy"]
    assert not re.search(r"<script[^>]* src=|href=", "".join(charts)), "the charts load nothing from elsewhere"
    assert len(outputs["classification_metrics"].metadata["confusionMatrix"]["rows"]) == 10
    assert outputs["chief_model"].metadata["source_uri"] == model.uri

    decision = Markdown(uri=str(tmp_path / "decision"))
    _run(
        "publish_model",
        model=outputs["chief_model"],
        metrics=outputs["metrics"],
        decision=decision,
        publish_uri=str(tmp_path / "published"),
    )
    latest = json.loads((tmp_path / "published" / "latest.json").read_text())
    assert decision.metadata == {
        "published": True,
        "version": latest["version"],
        "latest_version": latest["version"],
        "latest_path": latest["path"],
    }
    assert latest["lineage"] == {
        "run_id": "run-7",
        "dataset": "sample",
        "model_uri": model.uri,
        "parameters": history["parameters"],
    }
    worse = Metrics(uri=str(tmp_path / "worse"))
    worse.metadata.update({**outputs["metrics"].metadata, "accuracy": latest["metrics"]["accuracy"] - 0.01})
    kept = Markdown(uri=str(tmp_path / "kept"))
    _run(
        "publish_model",
        model=outputs["chief_model"],
        metrics=worse,
        decision=kept,
        publish_uri=str(tmp_path / "published"),
    )
    assert kept.metadata == {**decision.metadata, "published": False, "version": 0}, "deploy serves the better one"


@pytest.mark.slow
def test_parameter_server_bodies_train_together(small_data, tmp_path):
    cluster = Artifact(uri=str(tmp_path / "cluster"))
    tasks = _run(
        "create_ps_cluster", cluster=cluster, run_id="run-8", num_workers=1, num_ps=1, cluster_mode="local", port=2222
    )
    status = str(tmp_path / "status.json")
    common = {
        "dataset": small_data,
        "cluster": cluster,
        "run_id": "run-8",
        "status_uri": status,
        "startup_timeout": 120.0,
        "unschedulable_timeout": 60.0,
        "cluster_mode": "local",
    }
    failures = []

    def server(task):
        try:
            _run("train_server", task=task, chief_timeout=60.0, **common)
        except SystemExit as exit_info:
            failures.append((task, exit_info.code))

    threads = [threading.Thread(target=server, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    model = Model(uri=str(tmp_path / "model"))
    _run("train_chief", model=model, epochs=2, batch_size=64, learning_rate=0.002, tensorboard_dir="", **common)
    for thread in threads:
        thread.join(timeout=120)
    assert failures == [] and not any(t.is_alive() for t in threads)
    assert model.metadata["chief"] is True and model.metadata["strategy"] == "parameter_server"
    history = json.loads((tmp_path / "model" / "history.json").read_text())
    assert history["parameter_servers"] == 1 and len(history["epochs"]) == 2
    assert json.loads((tmp_path / run_key("run-8") / "status.json").read_text())["state"] == "succeeded"
