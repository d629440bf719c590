"""Faults with real worker processes: a worker killed mid-epoch, a peer that dies, an address that never resolves."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.conftest import ROOT, trainer_args
from trainer.cluster.local import free_ports
from trainer.cluster.tf_config import build_tf_config
from trainer.evaluation.metrics import run as evaluate


def _env(extra=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="1", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def launch(*args: str, env: dict | None = None) -> "Streamed":
    """`trainer-launch ARGS` with its merged output collected line by line; ENV added to the environment."""
    return Streamed([sys.executable, "-m", "trainer.launch", *args], _env(env))


class Streamed:
    """A process whose merged output is collected line by line while it runs."""

    def __init__(self, args, env):
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.lines[-40:]))

    def finish(self, timeout):
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()


@pytest.mark.slow
def test_a_peer_killed_mid_training_makes_both_workers_restart_in_place_and_finish(
    sample_data, undisturbed_two_workers, tmp_path
):
    args = trainer_args(
        sample_data, tmp_path / "model", "--epochs", "10", "--checkpoint-dir", str(tmp_path / "checkpoints")
    )
    launcher = launch("--workers", "2", "--max-restarts", "1", "--", *args)
    try:
        pid = int(launcher.wait_for(r"^\[worker 1\] .*cluster formed: .*\(pid (\d+)\)", 120).group(1))
        launcher.wait_for(r"^\[worker 1\] .*epoch 3:", 180)
        time.sleep(0.4)
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        for worker in (0, 1):
            launcher.wait_for(rf"^\[worker {worker}\] .*worker {worker}: restart 1 of 1 in place .*generation 1", 60)
        assert time.monotonic() - killed_at < 45, "the survivor stops promptly, not after a timeout"
        assert launcher.finish(400) == 0, "\n".join(launcher.lines[-40:])
    finally:
        launcher.kill()
    text = "\n".join(launcher.lines)
    before, after = text.split("restart 1 of 1", 1)
    done_before = [int(e) for e in re.findall(r"^\[worker 0\] .*epoch (\d+):", before, re.M)]
    done_after = [int(e) for e in re.findall(r"^\[worker 0\] .*epoch (\d+):", after, re.M)]
    assert done_before and done_before == list(range(1, done_before[-1] + 1))
    assert done_after == list(range(done_before[-1] + 1, 11)), "finished epochs are not redone; the rest are run once"
    assert "worker 1: restart 1 of 1 in place (exit code 137)" in text, "the killed one restarts"
    assert re.search(r"worker 0: restart 1 of 1 in place \(exit code 138\)", text), "and the survivor with it"
    assert len(re.findall(r"cluster formed", text)) == 4, "each worker's training process started twice, no more"
    resumed = evaluate(str(tmp_path / "model"), sample_data).accuracy
    undisturbed = evaluate(str(undisturbed_two_workers[0]), sample_data).accuracy
    assert abs(resumed - undisturbed) <= 0.005, (resumed, undisturbed)
    assert not os.listdir(tmp_path / "checkpoints"), "every worker removes its checkpoints after success"


@pytest.mark.slow
def test_peer_that_dies_and_is_not_restarted_fails_the_survivor_naming_it(sample_data, tmp_path):
    ports = free_ports(2)
    addresses = [f"localhost:{p}" for p in ports]
    workers = [
        Streamed(
            [sys.executable, "-m", "trainer.train", *trainer_args(sample_data, tmp_path / "model", "--epochs", "30")],
            _env({"TF_CONFIG": json.dumps(build_tf_config(addresses, "worker", i))}),
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
        env=_env({"TF_CONFIG": json.dumps(tf_config)}),
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
def test_whole_worker_processes_killed_are_replaced_and_every_worker_resumes_after_the_last_finished_epoch(
    sample_data, tmp_path
):
    """The local model of lost pods: worker 1's whole process killed, then the chief's with its disk wiped."""
    model = tmp_path / "model"
    launcher = launch("--workers", "2", "--max-restarts", "2", "--", *trainer_args(sample_data, model, "--epochs", "8"))
    try:
        pids = {i: int(launcher.wait_for(rf"started worker {i} \(pid (\d+)\)", 60).group(1)) for i in (0, 1)}
        launcher.wait_for(r"^\[worker 1\] .*epoch 2: ", 180)
        os.kill(pids[1], signal.SIGKILL)  # its supervisor: the training process dies with it, like a lost pod
        launcher.wait_for(r"worker 1 was killed by signal 9 .*starting a replacement \(1 of 2\)", 60)
        for worker in (0, 1):
            launcher.wait_for(rf"^\[worker {worker}\] .*resuming from the checkpoint: epochs 1-2 are done", 180)
        launcher.wait_for(r"^\[worker 0\] .*epoch 5: ", 180)
        os.kill(pids[0], signal.SIGKILL)
        shutil.rmtree(model.parent / "model.backup" / "worker-0")  # the replaced pod's disk is empty
        for worker in (0, 1):
            launcher.wait_for(rf"^\[worker {worker}\] .*resuming from the checkpoint: epochs 1-5 are done", 180)
        code = launcher.finish(300)
    finally:
        launcher.kill()
    text = "\n".join(launcher.lines)
    assert code == 0, text[-4000:]
    assert re.search(
        r"^\[worker 0\] .*worker 0: fetching the checkpoint of epoch 5 from the supervisor at ",
        text,
        re.M,
    )
    assert re.search(r"worker 0: generation \d resumes after epoch 5 \(checkpoint: handed over by localhost:", text)
    assert re.search(r"worker 1: generation \d resumes after epoch 5 \(checkpoint: its own\)", text)
    assert not re.search(r"resum\w* .*epoch 1\b|from scratch", text), "nobody starts again from epoch 1"
    for label in ("worker 0", "worker 1"):
        epochs = _epochs_run(launcher.lines, label)
        assert sorted(set(epochs)) == list(range(1, 9)) and epochs[-3:] == [6, 7, 8], (label, epochs)
    history = json.loads((model / "history.json").read_text())
    assert [e["epoch"] for e in history["epochs"]] == list(range(1, 9)), "the history carries the resumed epochs"
    assert evaluate(str(model), sample_data).accuracy >= 0.95
    assert not (model.parent / "model.backup").exists(), "every worker removes its checkpoints after success"
