"""The whole pipeline run here through kfp.local (`make run`): what it prints, trains, reports and publishes."""

import json
import re
import time
from pathlib import Path

import pytest

from tests.test_pipeline import _cli, _script


def _summary(stdout):
    return dict(re.findall(r"^(\w[\w ]*): (.+)$", stdout.split("pipeline finished in", 1)[1], re.M))


def _one_epoch_run(output_dir, publish_uri, min_accuracy):
    """A 2-worker, 1-epoch local pipeline run whose gate asks MIN_ACCURACY."""
    where = ["--output-dir", str(output_dir), "--publish-uri", str(publish_uri)]
    return _script("--local", "--num-workers", "2", "--epochs", "1", "--min-accuracy", min_accuracy, *where)


@pytest.mark.slow
def test_local_pipeline_end_to_end(tmp_path):
    from tests.test_tensorboard import TRAIN_TAGS, read_scalars

    published = tmp_path / "published"
    result = _script(
        "--local",
        "--num-workers",
        "2",
        "--output-dir",
        str(tmp_path / "run"),
        "--publish-uri",
        str(published),
        "--tensorboard-dir",
        str(tmp_path / "tb"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _summary(result.stdout)
    accuracy = float(summary["test accuracy"])
    assert accuracy >= 0.96
    assert summary["serving check"].startswith("passed: 256 held-out uint8 images as TF Serving REST instances")
    assert "Serving check: <b>passed</b>" in Path(summary["report"]).read_text()
    scalars = read_scalars(Path(summary["tensorboard"]) / "train")
    assert set(scalars) == TRAIN_TAGS and all([s for s, _ in v] == list(range(1, 13)) for v in scalars.values())
    assert [p.parent.name for p in (tmp_path / "tb").rglob("events.out.tfevents.*")] == ["train"], "the chief only"
    model, report = Path(summary["model"]), Path(summary["report"])
    assert (model / "saved_model" / "saved_model.pb").is_file()
    history = json.loads((model / "history.json").read_text())
    assert history["workers"] == 2, "both workers trained together in one MultiWorkerMirroredStrategy cluster"
    assert report.read_text().startswith("<!doctype html>") and f"Test accuracy {accuracy:.4f}" in report.read_text()
    latest = json.loads((published / "latest.json").read_text())
    assert summary["publish"] == f"published version {latest['version']} at {published / str(latest['version'])}"
    assert (
        json.loads((published / str(latest["version"]) / "metrics.json").read_text())["metrics"]["accuracy"] == accuracy
    )
    assert latest["lineage"]["dataset"] == "sample" and latest["lineage"]["parameters"]["num_workers"] == 2
    assert latest["lineage"]["run_id"] == history["run_id"] != ""

    worse = _one_epoch_run(tmp_path / "run2", str(published), min_accuracy="0.5")
    assert worse.returncode == 0, worse.stderr[-3000:]
    worse_accuracy = float(_summary(worse.stdout)["test accuracy"])
    assert 0.5 <= worse_accuracy < accuracy
    assert _summary(worse.stdout)["publish"] == (
        f"not published: accuracy {worse_accuracy:.4f} is below the published "
        f"version {latest['version']} ({accuracy:.4f})"
    )
    assert json.loads((published / "latest.json").read_text()) == latest, (
        "a worse model does not replace the published one"
    )


@pytest.mark.slow
def test_failed_quality_gate_publishes_nothing_and_the_run_succeeds(tmp_path):
    result = _one_epoch_run(tmp_path / "run", str(tmp_path / "published"), min_accuracy="0.999")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(result.stdout)
    assert summary["publish"].startswith("not published: accuracy") and "is below the gate 0.9990" in summary["publish"]
    assert not (tmp_path / "published").exists()
    assert "FAILED, not published" in Path(summary["report"]).read_text()


def test_local_parameter_server_run_is_refused_with_the_reason(tmp_path, capsys):
    result = _cli(capsys, "--local", "--strategy", "parameter_server", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert (
        "--strategy parameter_server is not allowed with --local: kfp.local runs at most 2 tasks at once"
        in result.stderr
    )
    assert not (tmp_path / "run").exists()


def test_local_run_with_three_workers_is_refused_at_once(tmp_path, capsys):
    start = time.monotonic()
    result = _cli(capsys, "--local", "--num-workers", "3", "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "at most 2 ParallelFor iterations at once" in result.stderr
    assert time.monotonic() - start < 30 and not (tmp_path / "run").exists()
