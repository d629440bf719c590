"""The whole pipeline run here through kfp.local (`make run`): what it prints, trains, reports and publishes."""

import json
import re
import time
from pathlib import Path

import pytest

from tests.support.pipelines import run_cli, run_script
from trainer.records.history import History


def _summary(stdout):
    return dict(re.findall(r"^(\w[\w ]*): (.+)$", stdout.split("pipeline finished in", 1)[1], re.M))


@pytest.mark.slow
def test_local_pipeline_end_to_end_and_a_failed_gate_publishes_nothing(tmp_path):
    """Two runs through kfp.local on the shipped sample: 4 epochs that pass every check and publish, then 1 epoch
    against a gate of 0.999, which routes around publishing and leaves the published model as it was."""
    from tests.support.tensorboard import TRAIN_TAGS, read_scalars

    published = tmp_path / "published"
    where = ["--num-workers", "2", "--publish-uri", str(published)]
    result = run_script(
        "--local",
        *where,
        "--epochs",
        "4",
        "--output-dir",
        str(tmp_path / "run"),
        "--tensorboard-dir",
        str(tmp_path / "tb"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _summary(result.stdout)
    accuracy = float(summary["test accuracy"])
    assert accuracy >= 0.95
    assert summary["serving check"].startswith("passed: 256 held-out uint8 images as TF Serving REST instances")
    assert "Serving check: <b>passed</b>" in Path(summary["report"]).read_text()
    scalars = read_scalars(Path(summary["tensorboard"]) / "train")
    assert set(scalars) == TRAIN_TAGS and all([s for s, _ in v] == list(range(1, 5)) for v in scalars.values())
    assert [p.parent.name for p in (tmp_path / "tb").rglob("events.out.tfevents.*")] == ["train"], "the chief only"
    model, report = Path(summary["model"]), Path(summary["report"])
    assert (model / "saved_model" / "saved_model.pb").is_file()
    history = History.read(str(model))
    assert history.workers == 2, "both workers trained together in one MultiWorkerMirroredStrategy cluster"
    assert report.read_text().startswith("<!doctype html>") and f"test accuracy {accuracy:.4f}" in report.read_text()
    latest = json.loads((published / "latest.json").read_text())
    assert summary["publish"] == f"published version {latest['version']} at {published / str(latest['version'])}"
    assert (
        json.loads((published / str(latest["version"]) / "metrics.json").read_text())["metrics"]["accuracy"] == accuracy
    )
    assert latest["lineage"]["dataset"] == "sample" and latest["lineage"]["parameters"]["num_workers"] == 2
    assert latest["lineage"]["run_id"] == history.run_id != ""

    held = run_script(
        "--local", *where, "--epochs", "1", "--min-accuracy", "0.999", "--output-dir", str(tmp_path / "run2")
    )
    assert held.returncode == 0, held.stderr[-3000:]
    summary = _summary(held.stdout)
    assert summary["publish"].startswith("not published: accuracy") and "is below the gate 0.9990" in summary["publish"]
    assert "FAILED, not published" in Path(summary["report"]).read_text()
    assert json.loads((published / "latest.json").read_text()) == latest, "the published model stays as it was"
    assert sorted(p.name for p in published.iterdir() if not p.name.startswith(".")) == sorted(
        [str(latest["version"]), "latest.json"]
    )


def test_local_parameter_server_run_is_refused_with_the_reason(tmp_path, capsys):
    result = run_cli(capsys, "--local", "--strategy", "parameter_server", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert (
        "--strategy parameter_server is not allowed with --local: kfp.local runs at most 2 tasks at once"
        in result.stderr
    )
    assert not (tmp_path / "run").exists()


def test_local_run_with_three_workers_is_refused_at_once(tmp_path, capsys):
    start = time.monotonic()
    result = run_cli(capsys, "--local", "--num-workers", "3", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "at most 2 ParallelFor iterations at once" in result.stderr
    assert time.monotonic() - start < 60 and not (tmp_path / "run").exists(), "refused before kfp.local starts"
