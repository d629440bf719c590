"""The supervisor of a training task: prompt cancel, the start-up watchdog, restarts in place and their barrier."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT
from tests.support.processes import children, run_module, trainer_args
from trainer.cluster.local_processes import free_ports
from trainer.cluster.topology import build_tf_config


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_until_listening(port, timeout=120):
    """Waits until something accepts connections on localhost:`port` (polling, with a deadline that fails)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on localhost:{port} after {timeout}s")


def _stuck_worker(sample_data, tmp_path, *extra):
    ports = free_ports(2)
    tf_config = build_tf_config([f"localhost:{p}" for p in ports], "worker", 0)
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.train", "--data", sample_data, "--model-dir", str(tmp_path / "model"), *extra],
        cwd=ROOT,
        env=_env(TF_CONFIG=json.dumps(tf_config)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ), ports


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_start_up_join_ends_the_task_within_5_seconds(sample_data, tmp_path, sig):
    proc, ports = _stuck_worker(sample_data, tmp_path, "--startup-timeout", "300")
    try:
        _wait_until_listening(ports[0])  # its TF server is up: it is in the strategy's constructor, joining
        started = children(proc.pid)
        assert started, "the training process started"
        sent = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert code == 128 + sig, proc.stderr.read()[-2000:]
    assert elapsed < 5, f"took {elapsed:.1f}s"
    assert not [pid for pid in started if _alive(pid)], "no process of the task is left"
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_the_watchdog_names_the_peer_that_never_came_and_exits_140(sample_data, tmp_path):
    started = time.monotonic()
    proc, ports = _stuck_worker(sample_data, tmp_path, "--startup-timeout", "8")
    code = proc.wait(timeout=120)
    stderr = proc.stderr.read()
    assert code == 140
    assert (
        f"error: worker 0: cluster start-up did not finish within 8s; unreachable: worker 1 at localhost:{ports[1]} "
        "(Connection refused)" in stderr
    )
    assert time.monotonic() - started < 60
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_bad_input_is_never_restarted(tmp_path):
    """A dataset that does not exist is exit 2, once, even with restarts allowed."""
    args = trainer_args(tmp_path / "nowhere", tmp_path / "model")
    quiet = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    result = run_module("trainer.launch", "--workers", "2", "--max-restarts", "3", "--", *args, env=quiet, timeout=180)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "restart" not in result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if "has no metadata.json" in line]
    assert 1 <= len(lines) <= 2, "each worker ran once (the launcher may stop the second before it reads the data)"


@pytest.mark.slow
def test_two_workers_train_on_ipv6_loopback_with_their_control_channel_there(sample_data, tmp_path):
    """TF_CONFIG, TensorFlow's gRPC and the supervisors' channel all on `[::1]:port` (the channel restarts need)."""
    from trainer.cluster.control import ADDRESSES_ENV, SECRET_ENV, new_secret

    ports = free_ports(4, "::1")
    cluster = {"worker": [f"[::1]:{p}" for p in ports[:2]]}
    control = {"worker": [f"[::1]:{p}" for p in ports[2:]]}
    env = _env(**{ADDRESSES_ENV: json.dumps(control), SECRET_ENV: new_secret()})
    args = trainer_args(sample_data, tmp_path / "model", "--epochs", "1", "--max-restarts", "1", "--run-id", "ipv6")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainer.train", *args],
            cwd=ROOT,
            env=dict(env, TF_CONFIG=json.dumps(build_tf_config(cluster, "worker", index))),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for index in range(2)
    ]
    try:
        outputs = [proc.communicate(timeout=400)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert sorted(os.listdir(tmp_path / "model")) == ["history.json", "model.keras", "saved_model"]
    assert "TRAINER_CONTROL_SECRET" not in "".join(outputs) and env[SECRET_ENV] not in "".join(outputs)


# Every TFJob policy x these exit codes, decided after no restart with one allowed. kubeflow/trainer v1.7-v1.9:
# `pkg/controller.v1/common/pod.go` hands OnFailure and Always to the kubelet as the pod's own restartPolicy (any
# failure restarts) and turns ExitCode into a pod that never restarts, the operator re-creating it when
# `pkg/util/train/train_util.go` `IsRetryableExitCode` (exitCode >= 128) says so; Never restarts nothing. Kept: all of
# that, except that Always runs as OnFailure (a task that finished is not started again) and that an exit a policy
# does not retry asks the peers first (a user's command cannot say that a lost peer made it fail).
CODES = (0, 1, 2, 137, 138, 142, 143)
S, R, F, A = "succeed", "restart", "fail", "ask_peers"
TFJOB_DECISIONS = {
    "Never": (S, A, A, A, A, A, A),
    "OnFailure": (S, R, R, R, R, R, R),
    "Always": (S, R, R, R, R, R, R),
    "ExitCode": (S, A, A, R, R, R, R),
}


@pytest.mark.parametrize("policy", list(TFJOB_DECISIONS))
def test_each_tfjob_restart_policy_decides_each_exit_code_as_the_operator_did(policy):
    from trainer.command import tfjob_spec

    rule = tfjob_spec.restart_policy(policy).limited(1)
    assert tuple(rule.decide(code).value for code in CODES) == TFJOB_DECISIONS[policy]
    asked = tuple(rule.decide(code, peers_asked=True).value for code in CODES)
    assert asked == tuple(F if d == A else d for d in TFJOB_DECISIONS[policy]), "asked once, a code not retried fails"
    spent = tuple(rule.decide(code, restarts=1).value for code in CODES)
    assert spent == tuple(F if d == R else d for d in TFJOB_DECISIONS[policy]), "no restart left: it fails"


def test_the_contracts_policy_restarts_its_retryable_codes_only_and_never_asks_the_peers():
    from trainer.cluster.policy import CONTRACT, Decision

    rule = CONTRACT.limited(2)
    assert [rule.decide(code).value for code in (*CODES, 130, 140, 3, 4, 5)] == [
        S, F, F, R, R, R, R, R, R, F, F, F,
    ]  # fmt: skip
    assert rule.decide(138, restarts=2) is Decision.FAIL and Decision.FAIL.is_final
    assert not Decision.RESTART.is_final and not Decision.ASK_PEERS.is_final
    assert CONTRACT.decide(138) is Decision.FAIL, "no restart allowed by default"
