"""Real multi-worker training: worker processes talking TF gRPC on loopback, on the shipped digits."""

import json
import os
import re
import socket
import time

import numpy as np
import pytest

from tests.support.processes import UNDISTURBED_EPOCHS, run_module, trainer_args
from trainer.cluster.local_processes import free_ports
from trainer.evaluation.metrics import Evaluation, compute_metrics, evaluate


def _launch(workers, sample_data, model_dir, tmp_path, *extra):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    args = trainer_args(sample_data, model_dir, *extra)
    result = run_module(
        "trainer.launch", "--workers", str(workers), "--", *args, env={"TMPDIR": str(scratch)}, timeout=400
    )
    return result, scratch


def _assert_only_chief_wrote(model_dir, scratch, workers):
    assert sorted(os.listdir(model_dir)) == ["history.json", "model.keras", "saved_model"]
    assert os.listdir(scratch) == [], "non-chief workers must delete their temporary saves"
    siblings = sorted(p for p in os.listdir(model_dir.parent) if p != "metrics.json")
    assert siblings == ["model", "scratch"], siblings
    history = json.loads((model_dir / "history.json").read_text())
    assert history["workers"] == workers
    assert history["global_batch_size"] == 64 * workers
    return history


@pytest.mark.slow
def test_two_workers_train_and_only_the_chief_writes(undisturbed_two_workers, sample_data, tmp_path):
    model_dir, scratch, result = undisturbed_two_workers
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"^\[worker 0\] .*chief wrote the model", result.stdout, re.M)
    assert re.search(rf"^\[worker 1\] .*epoch {UNDISTURBED_EPOCHS}:", result.stdout, re.M)
    assert "chief wrote" not in "".join(line for line in result.stdout.splitlines() if line.startswith("[worker 1]"))
    for index in range(2):
        assert re.search(rf"^\[worker {index}\] .*every worker finished: leaving", result.stdout, re.M), (
            "each worker waits for the other and leaves with its training input kept (trainer.training.teardown)"
        )
    history = _assert_only_chief_wrote(model_dir, scratch, 2)
    assert [e["epoch"] for e in history["epochs"]] == list(range(1, UNDISTURBED_EPOCHS + 1))
    assert all(e["examples_per_second"] > 0 for e in history["epochs"])
    metrics = evaluate(str(model_dir), sample_data, str(tmp_path / "metrics.json"))
    assert metrics.accuracy >= 0.95
    assert Evaluation.from_json(json.loads((tmp_path / "metrics.json").read_text())) == metrics


@pytest.mark.slow
def test_three_workers_reach_95_percent(sample_data, tmp_path):
    model_dir = tmp_path / "model"
    result, scratch = _launch(3, sample_data, model_dir, tmp_path, "--epochs", "6")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for index in range(3):
        assert re.search(rf"^\[worker {index}\] .*epoch 6:", result.stdout, re.M)
    _assert_only_chief_wrote(model_dir, scratch, 3)
    assert evaluate(str(model_dir), sample_data).accuracy >= 0.95


@pytest.mark.slow
def test_one_process_without_tf_config(sample_data, tmp_path):
    result = run_module("trainer.train", "--data", sample_data, "--model-dir", str(tmp_path / "model"), "--epochs", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((tmp_path / "model" / "history.json").read_text())
    assert history["workers"] == 1 and len(history["epochs"]) == 2
    assert evaluate(str(tmp_path / "model"), sample_data).accuracy >= 0.85


@pytest.mark.slow
def test_launcher_stops_the_others_when_one_fails(sample_data, tmp_path):
    """A bad flag: the first worker to fail exits 2 at once and the launcher stops the other instead of waiting."""
    start = time.monotonic()
    args = trainer_args(sample_data, tmp_path / "model", "--epochs", "0")
    result = run_module("trainer.launch", "--workers", "2", "--grace", "3", "--", *args, timeout=120)
    assert result.returncode == 2
    assert re.search(
        r"error: worker \d failed with exit code 2: .*epochs 0 is not allowed; allowed: an integer from 1 to "
        r"100000",
        result.stderr,
    )
    assert time.monotonic() - start < 60
    assert not (tmp_path / "model").exists()


def test_launcher_refuses_bad_worker_counts():
    for count in ("0", "-1", "17"):
        result = run_module("trainer.launch", "--workers", count, "--", "--data", "x", "--model-dir", "y")
        assert result.returncode == 2
        assert f"workers {count} is not allowed; allowed: an integer from 1 to 16" in result.stderr


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_metrics_from_known_predictions():
    probabilities = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.1], [0.1, 0.6, 0.3], [0.0, 0.2, 0.8]])
    labels = np.array([0, 1, 2, 2])
    metrics = compute_metrics(probabilities, labels, ["a", "b", "c"])
    assert metrics.accuracy == 0.75
    assert metrics.confusion_matrix == ((1, 0, 0), (0, 1, 0), (0, 1, 1))
    assert metrics.loss == pytest.approx(-np.mean(np.log([0.9, 0.7, 0.3, 0.8])), abs=1e-6)
    assert metrics.per_class[1] == {
        "class": 1,
        "name": "b",
        "precision": 0.5,
        "recall": 1.0,
        "f1": 0.666667,
        "support": 1,
    }
    assert metrics.per_class[2]["recall"] == 0.5 and metrics.per_class[2]["precision"] == 1.0
    assert Evaluation.from_json(json.loads(json.dumps(metrics.to_json()))) == metrics, "metrics.json round trip"
