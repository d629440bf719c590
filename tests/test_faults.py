"""Faults with real worker processes: a worker killed mid-epoch, a peer that dies, an address that never resolves."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT
from tests.support.processes import UNDISTURBED_EPOCHS, Streamed, child_env, launch, trainer_args
from trainer.cluster.local_processes import free_ports
from trainer.cluster.topology import build_tf_config
from trainer.core.runs import run_key
from trainer.evaluation.metrics import evaluate
from trainer.records.history import History


@pytest.mark.slow
def test_peer_that_dies_and_is_not_restarted_fails_the_survivor_naming_it(sample_data, tmp_path):
    ports = free_ports(2)
    addresses = [f"localhost:{p}" for p in ports]
    workers = [
        Streamed(
            [sys.executable, "-m", "trainer.train", *trainer_args(sample_data, tmp_path / "model", "--epochs", "30")],
            child_env({"TF_CONFIG": json.dumps(build_tf_config(addresses, "worker", i))}),
        )
        for i in range(2)
    ]
    try:
        workers[1].wait_for(r"epoch 2:", 180)
        workers[1].kill()
        killed_at = time.monotonic()
        code = workers[0].finish(120)
        elapsed = time.monotonic() - killed_at
    finally:
        for w in workers:
            w.kill()
    assert code == 138, "\n".join(workers[0].lines[-30:])
    assert elapsed < 60
    last = [line for line in workers[0].lines if line.startswith("error:")][-1]
    assert f"lost contact with a peer during training (worker 1 at localhost:{ports[1]} (Connection refused))" in last
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_unresolvable_peer_fails_within_the_timeout_naming_it(sample_data, tmp_path):
    port = free_ports(1)[0]
    tf_config = build_tf_config([f"localhost:{port}", "tfw-missing.nowhere.invalid:2222"], "worker", 0)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "trainer.train", *trainer_args(sample_data, tmp_path / "m", "--startup-timeout", "6")],
        cwd=ROOT,
        env=child_env({"TF_CONFIG": json.dumps(tf_config)}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 140, "the supervisor's start-up watchdog fired"
    assert "worker 1 at tfw-missing.nowhere.invalid:2222 (name does not resolve)" in result.stderr
    assert time.monotonic() - start < 60


def _epochs_run(lines, label):
    return [int(e) for e in re.findall(rf"^\[{label}\] .*epoch (\d+): ", "\n".join(lines), re.M)]


@pytest.mark.slow
def test_a_run_survives_a_killed_training_process_a_lost_worker_and_a_lost_chief_and_trains_as_if_undisturbed(
    sample_data, undisturbed_two_workers, tmp_path
):
    """One run, three faults, each after a finished epoch: worker 1's training process killed (both restart in place);
    worker 1's whole process killed (replaced, as a lost pod is); the chief's whole process killed with its
    checkpoints deleted (its replacement gets worker 1's copy). Every worker resumes after the last finished epoch
    and the model matches the undisturbed run's (`undisturbed_two_workers`: the same epochs, no fault)."""
    model, checkpoints = tmp_path / "model", tmp_path / "checkpoints"
    args = trainer_args(
        sample_data, model, "--epochs", str(UNDISTURBED_EPOCHS), "--checkpoint-dir", str(checkpoints), "--run-id", "f-1"
    )
    killed, lost_worker, lost_chief = 2, 3, 4  # the epochs after which each fault comes
    launcher = launch("--workers", "2", "--max-restarts", "3", "--", *args)
    try:
        pids = {i: int(launcher.wait_for(rf"started worker {i} \(pid (\d+)\)", 60).group(1)) for i in (0, 1)}
        child = int(launcher.wait_for(r"^\[worker 1\] .*cluster formed: .*\(pid (\d+)\)", 120).group(1))
        launcher.wait_for(rf"^\[worker 1\] .*epoch {killed}: ", 180)
        os.kill(child, signal.SIGKILL)  # the training process only: its supervisor restarts it in place
        for worker in (0, 1):
            launcher.wait_for(rf"^\[worker {worker}\] .*resuming from the checkpoint: epochs 1-{killed} are done", 180)
        launcher.wait_for(rf"^\[worker 1\] .*epoch {lost_worker}: ", 180)
        os.kill(pids[1], signal.SIGKILL)  # its supervisor: the training process dies with it, like a lost pod
        launcher.wait_for(r"worker 1 was killed by signal 9 .*starting a replacement \(1 of 3\)", 60)
        for worker in (0, 1):
            launcher.wait_for(
                rf"^\[worker {worker}\] .*resuming from the checkpoint: epochs 1-{lost_worker} are done", 180
            )
        launcher.wait_for(rf"^\[worker 0\] .*epoch {lost_chief}: ", 180)
        os.kill(pids[0], signal.SIGKILL)
        shutil.rmtree(checkpoints / run_key("f-1") / "worker-0")  # the replaced pod's disk is empty
        code = launcher.finish(400)
    finally:
        launcher.kill()
    text = "\n".join(launcher.lines)
    assert code == 0, text[-4000:]
    assert "worker 1: restart 1 of 3 in place (exit code 137)" in text, "the killed training process restarts"
    assert "worker 0: restart 1 of 3 in place (exit code 138)" in text, "and the survivor with it"
    assert re.search(
        rf"worker 0: fetching the checkpoint of epoch {lost_chief} from the supervisor at localhost:\d+", text
    )
    assert re.search(
        rf"worker 0: generation \d resumes after epoch {lost_chief} \(checkpoint: handed over by localhost:", text
    )
    assert re.search(rf"worker 1: generation \d resumes after epoch {lost_chief} \(checkpoint: its own\)", text)
    assert not re.search(r"start again at epoch 1", text), "nobody starts from scratch"
    for label in ("worker 0", "worker 1"):
        epochs = _epochs_run(launcher.lines, label)
        assert sorted(set(epochs)) == list(range(1, UNDISTURBED_EPOCHS + 1)) and len(epochs) == UNDISTURBED_EPOCHS, (
            label,
            epochs,
        )
    history = History.read(str(model))
    assert [e["epoch"] for e in history.epochs] == list(range(1, UNDISTURBED_EPOCHS + 1)), (
        "the history carries the resumed epochs"
    )
    resumed = evaluate(str(model), sample_data).accuracy
    undisturbed = evaluate(str(undisturbed_two_workers[0]), sample_data).accuracy
    assert resumed >= 0.95 and abs(resumed - undisturbed) <= 0.005, (resumed, undisturbed)
    assert not os.listdir(checkpoints), "every worker removes its checkpoints after success"
