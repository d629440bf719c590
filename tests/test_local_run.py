"""The whole pipeline run here through kfp.local (`make run`): what it prints, trains, reports and publishes."""

import json
import re
from pathlib import Path

import pytest

from tests.test_pipeline import _script


def _summary(stdout):
    return dict(re.findall(r"^(\w[\w ]*): (.+)$", stdout.split("pipeline finished in", 1)[1], re.M))


@pytest.mark.slow
def test_local_pipeline_end_to_end(tmp_path):
    published = tmp_path / "published"
    result = _script(
        "--local", "--num-workers", "2", "--output-dir", str(tmp_path / "run"), "--publish-uri", str(published)
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = _summary(result.stdout)
    accuracy = float(summary["test accuracy"])
    assert accuracy >= 0.96
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

    worse = _script(
        "--local",
        "--num-workers",
        "2",
        "--epochs",
        "1",
        "--min-accuracy",
        "0.5",
        "--output-dir",
        str(tmp_path / "run2"),
        "--publish-uri",
        str(published),
    )
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
    result = _script(
        "--local",
        "--num-workers",
        "2",
        "--epochs",
        "1",
        "--min-accuracy",
        "0.999",
        "--output-dir",
        str(tmp_path / "run"),
        "--publish-uri",
        str(tmp_path / "published"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = _summary(result.stdout)
    assert summary["publish"].startswith("not published: accuracy") and "is below the gate 0.9990" in summary["publish"]
    assert not (tmp_path / "published").exists()
    assert "FAILED, not published" in Path(summary["report"]).read_text()
