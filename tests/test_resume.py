"""Where a cluster resumes: per-task checkpoint homes, agreeing on one epoch, and a checkpoint handed to a peer over
the supervisors' real control channel (TCP on loopback). No TensorFlow: these are the supervisor's parts."""

import contextlib
import glob
import io
import json
import os
import re
import subprocess
import sys
import time

import pytest

from trainer.cluster.control import Control, PeerState
from trainer.cluster.local_processes import free_ports
from trainer.cluster.policy import CONTRACT
from trainer.cluster.resume import MANIFEST, CheckpointHome, Manifest, agree, task_dir
from trainer.cluster.supervisor import SupervisedTask, Supervisor
from trainer.core.errors import (
    EXIT_NO_SPACE,
    EXIT_PEER_UNAVAILABLE,
    EXIT_STARTUP_TIMEOUT,
    PeerUnavailableError,
    StartupTimeoutError,
)


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


SECRET = "0123456789abcdef" * 4


@pytest.fixture
def pair(tmp_path):
    """Two supervisors' control channels on loopback: a survivor and a replacement, each with its checkpoint home."""
    ports = free_ports(2)
    survivor_home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    replacement_home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    survivor = Control(ports[0], [f"localhost:{ports[1]}"], survivor_home.epoch, survivor_home.send, secret=SECRET)
    replacement = Control(
        ports[1], [f"localhost:{ports[0]}"], replacement_home.epoch, replacement_home.send, secret=SECRET
    )
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
    handover = replacement_home.hand_over(epoch)
    received = replacement.fetch(source, epoch, handover.receive, handover.resume_point())
    assert received == sent and replacement_home.latest() == sent
    for name in sent.files:
        assert (tmp_path / "replacement" / "worker-1" / name).read_bytes() == (
            tmp_path / "survivor" / "worker-0" / name
        ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "replacement" / "worker-1").iterdir()) == [*sent.files, MANIFEST]
    assert survivor.peer_states() == {f"localhost:{ports[1]}": PeerState(0, "starting", 4)}


def test_a_checkpoint_the_peer_does_not_hold_or_a_broken_stream_is_a_retryable_failure(pair, tmp_path):
    survivor, survivor_home, replacement, replacement_home, ports = pair
    (tmp_path / "survivor" / "worker-0").mkdir(parents=True)
    write_checkpoint(survivor_home, 2, b"x" * 5000)
    handover = replacement_home.hand_over(3)
    with pytest.raises(
        PeerUnavailableError,
        match=rf"the peer at localhost:{ports[0]} cannot send it: \S+/survivor/worker-0 holds no checkpoint of epoch 3",
    ):
        replacement.fetch(f"localhost:{ports[0]}", 3, handover.receive)
    key = b"k" * 32
    handover = replacement_home.hand_over(2)
    with pytest.raises(PeerUnavailableError, match="the checkpoint from worker 0 has no valid header"):
        handover.receive(io.BytesIO(b"HTTP/1.1 400 Bad Request\n"), "worker 0", key)
    stream = io.BytesIO()
    survivor_home.send(2, stream, key)
    whole = stream.getvalue()
    with pytest.raises(PeerUnavailableError, match="no valid header: it is not sealed with the run's secret"):
        handover.receive(io.BytesIO(whole), "worker 0", b"another run's key")
    with pytest.raises(PeerUnavailableError, match=r"broke off after 0.0 MB of 0.0 MB"):
        handover.receive(io.BytesIO(whole[: whole.index(b"\n") + 1 + 1000]), "worker 0", key)
    tampered = bytearray(whole)
    tampered[whole.index(b"\n") + 10] ^= 0xFF
    with pytest.raises(PeerUnavailableError, match="the checkpoint of epoch 2 from worker 0 fails its checksum"):
        handover.receive(io.BytesIO(bytes(tampered)), "worker 0", key)
    assert replacement_home.latest() is None, "nothing half-received counts as a checkpoint"
    assert handover.resume_point() == (0, ""), "bytes that failed their checksum are not kept"
    free = free_ports(1)[0]
    with pytest.raises(PeerUnavailableError, match=rf"cannot fetch the checkpoint of epoch 2 from localhost:{free}"):
        replacement.fetch(f"localhost:{free}", 2, handover.receive)


class Cut:
    """A survivor's `send` whose first connection breaks after `after` bytes; records what each transfer asked."""

    def __init__(self, home: CheckpointHome, after: int) -> None:
        self.home, self.after, self.offsets = home, after, []

    def __call__(self, epoch, out, key, offset, prefix):
        self.offsets.append(offset)
        self.home.send(epoch, _Breaking(out, self.after) if len(self.offsets) == 1 else out, key, offset, prefix)


class _Breaking:
    def __init__(self, out, after):
        self.out, self.left = out, after

    def write(self, data):
        if len(data) > self.left:
            self.out.write(data[: self.left])
            self.out.flush()
            raise ConnectionResetError("the test cuts the connection")
        self.left -= len(data)
        return self.out.write(data)

    def flush(self):
        self.out.flush()


def _big_checkpoint(home: CheckpointHome, epoch: int = 4, size: int = 8 << 20) -> Manifest:
    """A checkpoint of `size` + 6 bytes (its data file and an index of the same bytes)."""
    os.makedirs(home.uri, exist_ok=True)
    return write_checkpoint(home, epoch, os.urandom(size // 2), [{"epoch": e} for e in range(1, epoch + 1)])


def _same_files(a: CheckpointHome, b: CheckpointHome, manifest: Manifest) -> bool:
    return all(open(f"{a.uri}/{n}", "rb").read() == open(f"{b.uri}/{n}", "rb").read() for n in manifest.files)


def test_a_broken_transfer_resumes_where_it_broke_and_is_verified_end_to_end(tmp_path):
    ports = free_ports(2)
    survivor_home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    replacement_home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    sent = _big_checkpoint(survivor_home)
    total = sum(os.path.getsize(f"{survivor_home.uri}/{n}") for n in sent.files)
    cut = Cut(survivor_home, total // 2)
    survivor = Control(ports[0], [], survivor_home.epoch, cut, secret=SECRET)
    replacement = Control(ports[1], [f"localhost:{ports[0]}"], secret=SECRET)
    try:
        handover = replacement_home.hand_over(4, "worker 1")
        with pytest.raises(PeerUnavailableError, match=r"the checkpoint of epoch 4 from \S+ broke off after"):
            replacement.fetch(f"localhost:{ports[0]}", 4, handover.receive, handover.resume_point())
        assert replacement_home.latest() is None, "the home has no checkpoint of a broken transfer"
        kept, _ = handover.resume_point()
        assert total // 4 < kept < total
        received = replacement.fetch(f"localhost:{ports[0]}", 4, handover.receive, handover.resume_point())
    finally:
        survivor.close()
        replacement.close()
    assert cut.offsets == [0, kept], "the second transfer asked for the rest"
    assert handover.kept == kept and handover.received == total, "no byte crossed twice"
    assert received == sent and replacement_home.latest() == sent and _same_files(survivor_home, replacement_home, sent)
    assert sorted(os.listdir(replacement_home.uri)) == sorted([*sent.files, MANIFEST]), "the staging area is gone"


def test_kept_bytes_that_are_not_the_peers_are_sent_again_whole(tmp_path):
    ports = free_ports(2)
    survivor_home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    replacement_home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    sent = _big_checkpoint(survivor_home, size=3 << 20)
    cut = Cut(survivor_home, 2 << 20)
    survivor = Control(ports[0], [], survivor_home.epoch, cut, secret=SECRET)
    replacement = Control(ports[1], [], secret=SECRET)
    try:
        handover = replacement_home.hand_over(4)
        with pytest.raises(PeerUnavailableError, match="broke off"):
            replacement.fetch(f"localhost:{ports[0]}", 4, handover.receive, handover.resume_point())
        partial = os.path.join(handover.area, sent.files[0])
        with open(partial, "r+b") as f:
            f.write(b"not the peer's bytes")
        offset, prefix = handover.resume_point()
        assert offset > 0
        replacement.fetch(f"localhost:{ports[0]}", 4, handover.receive, (offset, prefix))
    finally:
        survivor.close()
        replacement.close()
    assert cut.offsets == [0, offset] and handover.kept == 0, "the peer's first bytes differ: it sent all again"
    assert replacement_home.latest() == sent and _same_files(survivor_home, replacement_home, sent)


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
    control = Control(ports[0], [f"localhost:{ports[1]}"], secret=SECRET)
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": 0}}
    marker = tmp_path / "started"
    task = SupervisedTask(
        [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"],
        dict(os.environ),
        tf_config,
        1,
        CONTRACT.limited(2),
    )
    supervisor = Supervisor(task, control, CheckpointHome(str(tmp_path / "home")))
    try:
        assert supervisor.run() == EXIT_STARTUP_TIMEOUT
    finally:
        control.close()
    assert capsys.readouterr().err.splitlines() == [
        f"error: worker 0: generation 0: peers not ready in time: no supervisor answers at localhost:{ports[1]}"
    ], "one line, and no restart: waiting again does not bring a lost peer back"
    assert not marker.exists(), "no training process was started"


@pytest.fixture
def survivor(tmp_path):
    """A survivor's supervisor channel holding an 8 MB checkpoint of epoch 4 (its send replaceable), and ports for
    a replacement's channel and the two tasks' TF servers."""
    ports = free_ports(4)
    home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    sent = _big_checkpoint(home)
    channel = {"send": home.send}
    control = Control(ports[0], [f"localhost:{ports[1]}"], home.epoch, lambda *a: channel["send"](*a), secret=SECRET)
    yield control, home, sent, channel, ports
    control.close()


def _replacement(tmp_path, ports, home, command=("-c", "pass"), max_restarts=0, **settings):
    """Worker 1's supervisor (the replacement), whose peer is the survivor; returns it and its control channel."""
    control = Control(ports[1], [f"localhost:{ports[0]}"], home.epoch, home.send, secret=SECRET)
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports[2:]]}, "task": {"type": "worker", "index": 1}}
    task = SupervisedTask([sys.executable, *command], dict(os.environ), tf_config, 30, CONTRACT.limited(max_restarts))
    supervisor = Supervisor(task, control, home, **settings)
    return supervisor, control


def test_a_supervisor_resumes_a_broken_hand_over_with_progress_lines(survivor, tmp_path, caplog, monkeypatch):
    import trainer.cluster.resume as resume

    monkeypatch.setattr(resume, "PROGRESS_SECONDS", 0.0)
    control, survivor_home, sent, channel, ports = survivor
    total = sum(os.path.getsize(f"{survivor_home.uri}/{n}") for n in sent.files)
    cut = Cut(survivor_home, total // 2)
    seen = []

    def send(*args):
        seen.append(control.ask(f"localhost:{ports[1]}"))
        cut(*args)

    channel["send"] = send
    home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    supervisor, own = _replacement(tmp_path, ports, home)
    caplog.set_level("INFO")
    try:
        assert supervisor.run() == 0
    finally:
        own.close()
    assert home.latest() == sent and _same_files(survivor_home, home, sent)
    assert [s.state for s in seen] == ["fetching", "fetching"], "the peers see the hand-over"
    kept = cut.offsets[1]
    assert cut.offsets == [0, kept] and kept > 0
    lines = [r.getMessage() for r in caplog.records]
    assert any(
        re.search(r"worker 1: the checkpoint of epoch 4 from localhost:\d+ broke off after [\d.]+ MB", x) for x in lines
    )
    assert any(f"from byte {kept} on (kept from a broken transfer)" in x for x in lines)
    assert any(
        re.fullmatch(
            r"worker 1: receiving the checkpoint of epoch 4 from localhost:\d+: "
            r"[\d.]+ MB of 8\.4 MB \(\d+%\), [\d.]+ MB/s",
            x,
        )
        for x in lines
    ), "progress lines: bytes done and total, rate"
    assert any(
        re.fullmatch(
            rf"worker 1: received the checkpoint of epoch 4 from localhost:\d+: [\d.]+ MB in [\d.]+ s, [\d.]+ MB/s; "
            rf"{kept / 1e6:.1f} MB of it kept from a broken transfer",
            x,
        )
        for x in lines
    )
    assert any(
        re.search(r"generation 0 resumes after epoch 4 \(checkpoint: handed over by localhost:\d+\)", x) for x in lines
    )


def test_a_hand_over_that_stalls_ends_the_task_with_138_naming_the_stall(survivor, tmp_path, capsys):
    import threading

    control, _, _, channel, ports = survivor
    released = threading.Event()
    channel["send"] = lambda *args: released.wait(30)
    home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    supervisor, own = _replacement(tmp_path, ports, home, handover_stall=1)
    try:
        assert supervisor.run() == EXIT_PEER_UNAVAILABLE
    finally:
        released.set()
        own.close()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and re.fullmatch(
        r"error: worker 1: the hand-over of the checkpoint of epoch 4 stalled: no byte for \d+s \(limit 1s\) after 0 "
        rf"bytes; last: cannot fetch the checkpoint of epoch 4 from localhost:{ports[0]}: timed out",
        err[0],
    ), err
    assert home.latest() is None


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs of the size asked (`mount(bytes)`), unmounted afterwards; fails where mounting is refused."""
    mounted = []

    def mount(size: int) -> str:
        path = tmp_path / f"tmpfs{len(mounted)}"
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
        if result.returncode:
            pytest.fail(f"cannot mount a tmpfs here (the suite runs as root): {result.stderr.decode().strip()}")
        mounted.append(path)
        return str(path)

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_a_full_disk_while_receiving_is_no_space_exit_3_and_the_old_checkpoint_stays(survivor, tmp_path, tmpfs, capsys):
    _, _, _, _, ports = survivor
    home = CheckpointHome(os.path.join(tmpfs(4 << 20), "worker-1"))
    old = write_checkpoint_in(home, 1, b"epoch one")
    supervisor, own = _replacement(tmp_path, ports, home, max_restarts=3)
    try:
        assert supervisor.run() == EXIT_NO_SPACE
    finally:
        own.close()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and re.fullmatch(
        rf"error: worker 1: no space left on the disk of {re.escape(home.uri)} for the checkpoint of epoch 4 from "
        rf"localhost:{ports[0]}: it needs 8388614 bytes \(8\.4 MB in all\), \d+ are free; free space there or give "
        "the task a larger volume",
        err[0],
    ), err
    assert home.latest() == old and sorted(os.listdir(home.uri)) == sorted([*old.files, MANIFEST]), "nothing else"


def test_a_disk_that_fills_during_the_transfer_is_no_space_exit_3(survivor, tmp_path, tmpfs, capsys):
    control, survivor_home, _, channel, ports = survivor
    disk = tmpfs(12 << 20)
    home = CheckpointHome(os.path.join(disk, "worker-1"))
    old = write_checkpoint_in(home, 1, b"epoch one")

    class Filling:
        """The survivor's stream: after the header, once the receiver has checked the space, another writer fills
        the disk."""

        def __init__(self, out):
            self.out, self.filled = out, False

        def write(self, data):
            if not self.filled and not data.startswith(b"{"):
                self.out.flush()
                deadline = time.monotonic() + 30
                while not glob.glob(os.path.join(home.uri, ".handover-4")) and time.monotonic() < deadline:
                    time.sleep(0.01)
                with open(os.path.join(disk, "filler"), "wb") as f, contextlib.suppress(OSError):
                    f.write(b"\0" * (8 << 20))
                self.filled = True
            return self.out.write(data)

        def flush(self):
            self.out.flush()

    channel["send"] = lambda epoch, out, *rest: survivor_home.send(epoch, Filling(out), *rest)
    supervisor, own = _replacement(tmp_path, ports, home)
    try:
        assert supervisor.run() == EXIT_NO_SPACE
    finally:
        own.close()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and re.fullmatch(
        rf"error: worker 1: no space left on the disk of {re.escape(home.uri)} while receiving the checkpoint of "
        rf"epoch 4 from localhost:{ports[0]}: it needs 8388614 bytes \(8\.4 MB\), the disk filled after [\d.]+ MB; "
        "the partial copy is removed; free space there or give the task a larger volume",
        err[0],
    ), err
    assert home.latest() == old and sorted(os.listdir(home.uri)) == sorted([*old.files, MANIFEST])


def write_checkpoint_in(home: CheckpointHome, epoch: int, payload: bytes) -> Manifest:
    os.makedirs(home.uri, exist_ok=True)
    return write_checkpoint(home, epoch, payload, [{"epoch": epoch}])


def test_the_start_up_watchdog_waits_while_a_peer_receives_a_checkpoint(tmp_path, caplog):
    """Worker 0's training process takes 3 s to form (here: to end) with a 1 s start-up timeout: a peer receiving
    a checkpoint all that time keeps the watchdog from firing."""
    ports = free_ports(4)
    peer = Control(ports[1], [], secret=SECRET)
    peer.set(0, "fetching")
    own = Control(ports[0], [f"localhost:{ports[1]}"], secret=SECRET)
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports[2:]]}, "task": {"type": "worker", "index": 0}}
    supervisor = Supervisor(
        SupervisedTask([sys.executable, "-c", "import time; time.sleep(3)"], dict(os.environ), tf_config, 1), own
    )
    caplog.set_level("INFO")
    try:
        assert supervisor.run() == 0
    finally:
        own.close()
        peer.close()
    waits = f"worker 0: the supervisor at localhost:{ports[1]} is receiving a checkpoint; the start-up watchdog waits"
    assert f"{waits} for it" in caplog.messages
