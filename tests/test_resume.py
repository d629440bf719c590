"""Where a cluster resumes: per-task checkpoint homes, agreeing on one epoch, and a checkpoint handed to a peer over
the supervisors' real control channel (TCP on loopback). No TensorFlow: these are the supervisor's parts."""

import io
import json
import os
import sys
import time

import pytest

from trainer.cluster.control import Control, PeerState
from trainer.cluster.local import free_ports
from trainer.cluster.resume import MANIFEST, CheckpointHome, Manifest, agree, task_dir
from trainer.cluster.supervisor import Supervisor
from trainer.core.errors import EXIT_STARTUP_TIMEOUT, PeerUnavailableError, StartupTimeoutError


def write_checkpoint(home: CheckpointHome, epoch: int, payload: bytes, history=()) -> Manifest:
    """What TensorFlow's Checkpoint.write leaves at home.prefix(epoch), then the commit the callback makes."""
    prefix = home.prefix(epoch)
    with open(f"{prefix}.index", "wb") as f:
        f.write(b"index-" + payload)
    with open(f"{prefix}.data-00000-of-00001", "wb") as f:
        f.write(payload)
    return home.commit(epoch, list(history))


@pytest.fixture
def home(tmp_path):
    path = tmp_path / "root" / "worker-1"
    path.mkdir(parents=True)
    return CheckpointHome(str(path))


def test_a_home_keeps_only_its_latest_complete_checkpoint(home, tmp_path):
    assert home.latest() is None and home.epoch() == 0
    write_checkpoint(home, 1, b"one", [{"epoch": 1}])
    manifest = write_checkpoint(home, 2, b"two" * 1000, [{"epoch": 1}, {"epoch": 2}])
    assert manifest == Manifest(2, ("ckpt-2.data-00000-of-00001", "ckpt-2.index"), ({"epoch": 1}, {"epoch": 2}))
    assert home.latest() == manifest and home.epoch() == 2
    assert sorted(p.name for p in (tmp_path / "root" / "worker-1").iterdir()) == [
        "ckpt-2.data-00000-of-00001",
        "ckpt-2.index",
        MANIFEST,
    ]
    home.clear()
    assert list((tmp_path / "root").iterdir()) == [], "the home goes after success"
    home.clear(remove_root=True)
    assert not (tmp_path / "root").exists(), "and a default root with it when that is left empty"


def test_a_manifest_that_is_not_one_counts_as_no_checkpoint(home, tmp_path):
    (tmp_path / "root" / "worker-1" / MANIFEST).write_text(json.dumps({"epoch": 3, "files": ["../../etc/passwd"]}))
    assert home.latest() is None
    (tmp_path / "root" / "worker-1" / MANIFEST).write_text("{not json")
    assert home.epoch() == 0
    with pytest.raises(ValueError, match="names a foreign file 'ckpt-2.index'"):
        Manifest.from_json({"epoch": 3, "files": ["ckpt-2.index"]})


def test_the_task_directory_names_the_task():
    assert task_dir(None) == "worker-0"
    assert task_dir({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}) == "worker-1"
    assert task_dir({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}) == "chief-0"


@pytest.mark.parametrize(
    ("own", "peers", "expected"),
    [
        (0, {"a:2": 0, "b:2": None}, (0, None)),
        (3, {"a:2": 3, "b:2": 2}, (3, None)),
        (0, {"a:2": 2, "b:2": 3}, (3, "b:2")),
        (2, {"a:2": 3, "b:2": 3}, (3, "a:2")),
    ],
    ids=["nobody has one", "own is the latest", "a replacement fetches the latest", "an older copy is replaced"],
)
def test_the_cluster_resumes_after_the_latest_epoch_any_task_holds(own, peers, expected):
    assert agree(own, peers) == expected


@pytest.fixture
def pair(tmp_path):
    """Two supervisors' control channels on loopback: a survivor and a replacement, each with its checkpoint home."""
    ports = free_ports(2)
    survivor_home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    replacement_home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    survivor = Control(ports[0], [f"localhost:{ports[1]}"], survivor_home.epoch, survivor_home.send)
    replacement = Control(ports[1], [f"localhost:{ports[0]}"], replacement_home.epoch, replacement_home.send)
    yield survivor, survivor_home, replacement, replacement_home, ports
    survivor.close()
    replacement.close()


def test_a_replacement_with_an_empty_home_receives_the_survivors_checkpoint_byte_for_byte(pair, tmp_path):
    survivor, survivor_home, replacement, replacement_home, ports = pair
    (tmp_path / "survivor" / "worker-0").mkdir(parents=True)
    payload = bytes(range(256)) * 9000  # 2.3 MB: more than one chunk
    sent = write_checkpoint(survivor_home, 4, payload, [{"epoch": e, "loss": 1 / e} for e in range(1, 5)])
    survivor.set(2, "failed")
    assert replacement.peer_states() == {f"localhost:{ports[0]}": PeerState(2, "failed", 4)}
    epoch, source = agree(replacement_home.epoch(), {a: s.checkpoint for a, s in replacement.peer_states().items()})
    assert (epoch, source) == (4, f"localhost:{ports[0]}")
    received = replacement.fetch(source, epoch, replacement_home.receive)
    assert received == sent and replacement_home.latest() == sent
    for name in sent.files:
        assert (tmp_path / "replacement" / "worker-1" / name).read_bytes() == (
            tmp_path / "survivor" / "worker-0" / name
        ).read_bytes()
    assert survivor.peer_states() == {f"localhost:{ports[1]}": PeerState(0, "starting", 4)}


def test_a_checkpoint_the_peer_does_not_hold_or_a_broken_stream_is_a_retryable_failure(pair, tmp_path):
    survivor, survivor_home, replacement, replacement_home, ports = pair
    (tmp_path / "survivor" / "worker-0").mkdir(parents=True)
    write_checkpoint(survivor_home, 2, b"x" * 5000)
    with pytest.raises(
        PeerUnavailableError,
        match=rf"the peer at localhost:{ports[0]} cannot send it: \S+/survivor/worker-0 holds no checkpoint of epoch 3",
    ):
        replacement.fetch(f"localhost:{ports[0]}", 3, replacement_home.receive)
    with pytest.raises(PeerUnavailableError, match="the checkpoint from worker 0 has no valid header"):
        replacement_home.receive(io.BytesIO(b"HTTP/1.1 400 Bad Request\n"), "worker 0")
    stream = io.BytesIO()
    survivor_home.send(2, stream)
    whole = stream.getvalue()
    with pytest.raises(PeerUnavailableError, match=r"ended after 1000 of 5000 bytes of ckpt-2.data-00000-of-00001"):
        replacement_home.receive(io.BytesIO(whole[: whole.index(b"\n") + 1 + 1000]), "worker 0")
    tampered = bytearray(whole)
    tampered[whole.index(b"\n") + 10] ^= 0xFF
    with pytest.raises(PeerUnavailableError, match="the checkpoint of epoch 2 from worker 0 fails its checksums"):
        replacement_home.receive(io.BytesIO(bytes(tampered)), "worker 0")
    assert replacement_home.latest() is None, "nothing half-received counts as a checkpoint"
    free = free_ports(1)[0]
    with pytest.raises(PeerUnavailableError, match=rf"cannot fetch the checkpoint of epoch 2 from localhost:{free}"):
        replacement.fetch(f"localhost:{free}", 2, replacement_home.receive)


@pytest.mark.parametrize(
    ("peer_generation", "peer_state", "joins"),
    [(0, "starting", 0), (0, "running", 0), (0, "formed", 1), (3, "failed", 4), (3, "running", 3)],
    ids=["peer starting", "peer waiting to form", "peer trained without us", "peer failed", "peer joining"],
)
def test_a_supervisor_that_comes_up_joins_the_generation_its_peers_are_about_to_start(
    pair, peer_generation, peer_state, joins
):
    survivor, _, replacement, _, _ = pair
    survivor.set(peer_generation, peer_state)
    assert replacement.first_generation() == joins


def test_peers_converge_on_a_restart_and_none_starts_while_an_older_attempt_runs(pair):
    a, _, b, _, ports = pair
    a.set(0, "formed")
    b.set(0, "formed")
    assert a.failed_peer(0) is None
    b.set(0, "failed")
    assert a.failed_peer(0) == f"localhost:{ports[1]}", "a's training process is stopped to restart together"
    b.set(1, "starting")
    assert a.failed_peer(0) == f"localhost:{ports[1]}", "so is it when the peer has moved on (a replacement)"
    started = time.monotonic()
    with pytest.raises(
        StartupTimeoutError,
        match=rf"generation 1: peers not ready in time: still running an older attempt: localhost:{ports[0]}",
    ):
        b.barrier(1, deadline=time.monotonic() + 1)
    assert time.monotonic() - started >= 1
    a.set(0, "failed")
    assert b.barrier(1, deadline=time.monotonic() + 30) == {f"localhost:{ports[0]}": PeerState(0, "failed", 0)}
    a.close()
    assert b.peer_states() == {f"localhost:{ports[0]}": None}, "a supervisor that is gone does not answer"
    with pytest.raises(StartupTimeoutError, match=rf"no supervisor answers at localhost:{ports[0]}"):
        b.barrier(1, deadline=time.monotonic())


def test_peers_that_never_answer_end_the_task_once_instead_of_restarting_it(tmp_path, capsys):
    ports = free_ports(2)
    control = Control(ports[0], [f"localhost:{ports[1]}"])
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": 0}}
    marker = tmp_path / "started"
    supervisor = Supervisor(
        [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"],
        dict(os.environ),
        tf_config,
        startup_timeout=1,
        max_restarts=2,
        control=control,
        home=CheckpointHome(str(tmp_path / "home")),
    )
    try:
        assert supervisor.run() == EXIT_STARTUP_TIMEOUT
    finally:
        control.close()
    assert capsys.readouterr().err.splitlines() == [
        f"error: worker 0: generation 0: peers not ready in time: no supervisor answers at localhost:{ports[1]}"
    ], "one line, and no restart: waiting again does not bring a lost peer back"
    assert not marker.exists(), "no training process was started"
