"""A run's state is the run's: checkpoints, status and leftovers keyed by the run, whatever location the user passed."""

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT
from tests.support.processes import run_module, trainer_args
from trainer.cluster.resume import CheckpointHome, checkpoint_root, clean_leftovers, home_for
from trainer.command.run import _checkpoint_dir
from trainer.config.contract import RuntimeConfig, TrainConfig
from trainer.core.errors import UsageError
from trainer.core.runs import is_run_key, new_run_id, run_key, run_status_uri
from trainer.training.parameter_server import status_uri

WORKER_1 = {"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}
DAY = 24 * 3600


def _config(**runtime):
    return TrainConfig(RuntimeConfig(**{"data_dir": "d", "model_dir": "/models/m", **runtime}))


def test_a_users_checkpoint_dir_gets_a_directory_per_run():
    night_1 = home_for(_config(checkpoint_dir="gs://team/ckpt/", run_id="run-night-1"), WORKER_1)
    night_2 = home_for(_config(checkpoint_dir="gs://team/ckpt", run_id="run-night-2"), WORKER_1)
    assert night_1.uri == f"gs://team/ckpt/{run_key('run-night-1')}/worker-1"
    assert night_2.uri == f"gs://team/ckpt/{run_key('run-night-2')}/worker-1"
    assert home_for(_config(run_id="x"), None).uri == f"/models/m.backup/{run_key('x')}/worker-0"
    assert checkpoint_root(_config(run_id="x")) == "/models/m.backup"
    with pytest.raises(UsageError, match="run id is empty"):
        home_for(_config(checkpoint_dir="/c"), None)


def test_a_commands_checkpoint_dir_is_the_runs_own_under_the_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert _checkpoint_dir("/mnt/shared/", "run-a") == f"/mnt/shared/{run_key('run-a')}"
    assert _checkpoint_dir("gs://b/c", "run-b") == f"gs://b/c/{run_key('run-b')}"
    assert _checkpoint_dir("", "run-a").endswith(f"/tfjob-checkpoints/{run_key('run-a')}")


def test_a_status_uri_the_user_passed_is_made_the_runs_own():
    assert run_status_uri("configmap:train-status", "run-a") == f"configmap:train-status-{run_key('run-a')}"
    assert run_status_uri("s3://bucket/status/status.json", "run-a") == (
        f"s3://bucket/status/{run_key('run-a')}/status.json"
    )
    assert run_status_uri("status.json", "run-a") == f"{run_key('run-a')}/status.json"
    ps = TrainConfig(RuntimeConfig(data_dir="d", model_dir="/m/model", run_id="run-a", status_uri="/shared/s.json"))
    assert status_uri(ps) == f"/shared/{run_key('run-a')}/s.json"
    assert status_uri(ps.replace(status_uri="", cluster_mode="local")) == f"/m/model.status/{run_key('run-a')}.json"
    assert status_uri(ps.replace(status_uri="")) == (f"configmap:tfw-{run_key('run-a')}-status")


def test_generated_run_ids_differ_and_keys_are_recognised():
    first, second = new_run_id(), new_run_id()
    assert first != second and first.startswith("local-")
    assert is_run_key(run_key(first)) and not is_run_key("worker-0") and not is_run_key("r12345")


def _written(path, at: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    os.utime(path, (at, at))


def test_leftovers_of_other_runs_are_removed_once_stale_and_younger_ones_kept(tmp_path, caplog):
    now = time.time()
    own, live, dead = run_key("own"), run_key("live"), run_key("dead")
    _written(tmp_path / own / "worker-0" / "ckpt-1.index", now - 3 * DAY)
    _written(tmp_path / live / "worker-0" / "resume.json", now - 3600)
    _written(tmp_path / live / "worker-1" / "resume.json", now - 2 * DAY)
    _written(tmp_path / dead / "worker-0" / "resume.json", now - 2 * DAY)
    _written(tmp_path / "worker-0" / "resume.json", now - 5 * DAY)
    (tmp_path / run_key("empty") / "worker-0").mkdir(parents=True)
    _written(tmp_path / "notes" / "old.txt", now - 90 * DAY)
    _written(tmp_path / "rnotakey12" / "old.txt", now - 90 * DAY)
    with caplog.at_level(logging.INFO, logger="trainer.cluster.resume"):
        removed = clean_leftovers(str(tmp_path), "own", now)
    assert sorted(removed) == sorted([dead, "worker-0", run_key("empty")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([own, live, "notes", "rnotakey12"])
    assert (tmp_path / own / "worker-0" / "ckpt-1.index").exists(), "a run never removes its own"
    kept = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kept")]
    assert kept == [
        f"kept {tmp_path}/{live}: another run's checkpoints, last written 1.0 h ago (removed once 24 h old)"
    ]
    gone = {r.getMessage() for r in caplog.records if r.getMessage().startswith("removed")}
    assert f"removed {tmp_path}/{dead}: a finished or failed run's checkpoints, last written 48.0 h ago" in gone


def test_a_commands_checkpoint_dirs_are_counted_never_removed(tmp_path, caplog):
    now = time.time()
    _written(tmp_path / run_key("old") / "model.ckpt", now - 30 * DAY)
    _written(tmp_path / run_key("young") / "model.ckpt", now - 2 * 3600)
    _written(tmp_path / "worker-0" / "the users-own.ckpt", now - 30 * DAY)
    with caplog.at_level(logging.INFO, logger="trainer.cluster.resume"):
        assert clean_leftovers(str(tmp_path), "own", now, remove=False) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([run_key("old"), run_key("young"), "worker-0"])
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path} holds 2 other runs' CHECKPOINT_DIR (the oldest last written 720.0 h ago); what commands write "
        "there is theirs and is never removed here: delete old ones yourself (a bucket lifecycle rule, a cron job)"
    ]


def test_a_successful_run_removes_its_own_directory_and_the_default_root(tmp_path):
    home = CheckpointHome(str(tmp_path / "m.backup" / run_key("a") / "worker-0"))
    _written(tmp_path / "m.backup" / run_key("a") / "worker-0" / "ckpt-1.index", time.time())
    _written(tmp_path / "m.backup" / run_key("b") / "worker-0" / "ckpt-1.index", time.time())
    home.clear(remove_root=True)
    assert sorted(p.name for p in (tmp_path / "m.backup").iterdir()) == [run_key("b")], "another run's stays"
    CheckpointHome(str(tmp_path / "m.backup" / run_key("b") / "worker-0")).clear(remove_root=True)
    assert list(tmp_path.iterdir()) == []


def _train(sample_data, model_dir, checkpoints, run_id, epochs=5):
    args = trainer_args(sample_data, model_dir, "--epochs", str(epochs), "--steps-per-epoch", "4", "--batch-size")
    return [*args, "32", "--checkpoint-dir", str(checkpoints), "--run-id", run_id]


def _epochs_logged(stderr: str) -> list[int]:
    return [
        int(line.split(" epoch ")[1].split(":")[0])
        for line in stderr.splitlines()
        if " epoch " in line and ": {" in line
    ]


@pytest.mark.slow
def test_runs_on_one_checkpoint_dir_keep_to_their_own_a_new_one_starts_at_epoch_1_and_a_killed_one_resumes(
    sample_data, tmp_path
):
    """Three runs start at once on one checkpoint_dir: two finish their 3 epochs, the third is killed after its
    epoch 3 and its checkpoint outlives the others' clean-ups. A new run then starts at epoch 1 beside it, and the
    killed run, started again, resumes after epoch 3."""
    checkpoints = tmp_path / "checkpoints"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1")
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("trial-2", "trial-3")}
    trials = {
        name: subprocess.Popen(
            [sys.executable, "-m", "trainer.train", *_train(sample_data, tmp_path / name, checkpoints, name, 3)],
            cwd=ROOT,
            env=env,
            stderr=log,
            text=True,
        )
        for name, log in logs.items()
    }
    first = subprocess.Popen(
        [sys.executable, "-m", "trainer.train", *_train(sample_data, tmp_path / "first", checkpoints, "night-1")],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = []
    for line in first.stderr:
        seen.append(line)
        if " epoch 3: {" in line:
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=120)
    assert first.returncode == -signal.SIGKILL, "".join(seen)[-3000:]
    for name, process in trials.items():
        process.wait(timeout=600)
        logs[name].seek(0)
        stderr = logs[name].read()
        logs[name].close()
        assert process.returncode == 0, f"{name}: {stderr[-3000:]}"
        assert _epochs_logged(stderr) == [1, 2, 3], f"{name}: {stderr[-3000:]}"
        assert "resuming" not in stderr
        history = json.loads((tmp_path / name / "history.json").read_text())
        assert history["run_id"] == name and len(history["epochs"]) == 3
    assert sorted(p.name for p in checkpoints.iterdir()) == [run_key("night-1")], "the finished runs' homes went"
    assert json.loads((checkpoints / run_key("night-1") / "worker-0" / "resume.json").read_text())["epoch"] == 3

    second = run_module("trainer.train", *_train(sample_data, tmp_path / "second", checkpoints, "night-2"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert _epochs_logged(second.stderr) == [1, 2, 3, 4, 5], second.stderr[-3000:]
    assert "resuming" not in second.stderr
    assert f"kept {checkpoints}/{run_key('night-1')}: another run's checkpoints" in second.stderr
    history = json.loads((tmp_path / "second" / "history.json").read_text())
    assert [e["epoch"] for e in history["epochs"]] == [1, 2, 3, 4, 5] and history["run_id"] == "night-2"
    assert sorted(p.name for p in checkpoints.iterdir()) == [run_key("night-1")], "the others' homes went on success"

    again = run_module("trainer.train", *_train(sample_data, tmp_path / "first", checkpoints, "night-1"))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from the checkpoint: epochs 1-3 are done, continuing with epoch 4" in again.stderr
    assert _epochs_logged(again.stderr) == [4, 5], again.stderr[-3000:]
    assert list(checkpoints.iterdir()) == []
