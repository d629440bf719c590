"""The supervisors' control channel belongs to the run: only the run's secret gets an answer, lines and connections
are bounded, and it works over IPv6 (`::1`) as over IPv4. Real sockets on loopback; no TensorFlow."""

import json
import os
import socket
import subprocess
import sys

import pytest

from trainer.cluster import control as control_lib
from trainer.cluster.cluster_record import ClusterRecord
from trainer.cluster.control import MAX_LINE, Control, PeerState, connection_limits, seal
from trainer.cluster.local_processes import free_ports
from trainer.cluster.resume import CheckpointHome
from trainer.core.errors import PeerUnavailableError, UsageError

SECRET = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4
WARNING = "trainer.cluster.control"


@pytest.fixture
def served(tmp_path):
    """A supervisor's channel serving a 3 MB checkpoint of epoch 2 on loopback: (control, home, port)."""
    home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    os.makedirs(home.uri)
    with open(f"{home.uri}/ckpt-2.index", "wb") as f:
        f.write(b"index")
    with open(f"{home.uri}/ckpt-2.data-00000-of-00001", "wb") as f:
        f.write(os.urandom(3 << 20))
    home.commit(2, [{"epoch": 1}, {"epoch": 2}])
    port = free_ports(1)[0]
    control = Control(port, [], home.epoch, home.send, secret=SECRET)
    control.set(1, "formed")
    yield control, home, port
    control.close()


@pytest.fixture
def quick_warnings(monkeypatch):
    monkeypatch.setattr(control_lib, "WARN_EVERY_SECONDS", 0.0)


def _raw(port: int, host: str = "127.0.0.1") -> socket.socket:
    conn = socket.create_connection((host, port), timeout=30)
    conn.settimeout(30)
    return conn


def _read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset, when it left our bytes unread)."""
    data = b""
    try:
        while chunk := conn.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _greeting(conn: socket.socket) -> str:
    line = b""
    while not line.endswith(b"\n"):
        chunk = conn.recv(1)
        assert chunk, "the server greets with its challenge"
        line += chunk
    return json.loads(line)["nonce"]


def _request(challenge: str, secret: str = SECRET, **body) -> bytes:
    body = dict(body, nonce="ab" * 16)
    body["mac"] = seal(secret.encode(), f"request\n{challenge}", body)
    return json.dumps(body).encode() + b"\n"


def test_a_client_without_the_runs_secret_gets_nothing_and_is_named(served, tmp_path, caplog, quick_warnings):
    control, home, port = served
    fetch = {"op": "fetch", "epoch": 2, "offset": 0, "sha256": ""}
    attempts = {
        "no proof": lambda challenge: json.dumps(fetch).encode() + b"\n",
        "another run's secret": lambda challenge: _request(challenge, OTHER, **fetch),
        "a proof replayed from another connection": lambda challenge: _request("cd" * 16, **fetch),
    }
    for what, request in attempts.items():
        caplog.clear()
        with _raw(port) as conn:
            conn.sendall(request(_greeting(conn)))
            assert _read_all(conn) == b"", f"{what}: not a byte of the checkpoint, nor of the state"
            local = f"127.0.0.1:{conn.getsockname()[1]}"
        assert [r.getMessage() for r in caplog.records if r.name == WARNING] == [
            f"control channel: closed a connection from {local}: its request does not prove the run's secret"
        ], what

    stranger_home = CheckpointHome(str(tmp_path / "stranger" / "worker-1"))
    stranger = Control(free_ports(1)[0], [f"localhost:{port}"], secret=OTHER)
    try:
        assert stranger.peer_states() == {f"localhost:{port}": None}, "another run's task learns nothing"
        handover = stranger_home.hand_over(2)
        with pytest.raises(
            PeerUnavailableError,
            match=rf"the peer at localhost:{port} closed the connection without sending the checkpoint \(it does not "
            r"take this run's secret, or it is stopping\)",
        ):
            stranger.fetch(f"localhost:{port}", 2, handover.receive)
    finally:
        stranger.close()
    assert not os.path.exists(stranger_home.uri), "nothing was received"

    with _raw(port) as conn:
        conn.sendall(_request(_greeting(conn), op="state"))
        answer = json.loads(_read_all(conn))
    assert PeerState.from_json(answer) == PeerState(1, "formed", 2), "the run's own secret gets the state"


def test_an_oversized_request_line_closes_the_connection_with_one_warning(served, caplog, quick_warnings):
    control, _, port = served
    with _raw(port) as conn:
        _greeting(conn)
        try:
            conn.sendall(b"{" + b"x" * (4 * MAX_LINE))
        except OSError:
            pass
        assert _read_all(conn) == b""
        local = f"127.0.0.1:{conn.getsockname()[1]}"
    assert [r.getMessage() for r in caplog.records if r.name == WARNING] == [
        f"control channel: closed a connection from {local}: its request is longer than {MAX_LINE} bytes"
    ]
    assert Control(free_ports(1)[0], [f"localhost:{port}"], secret=SECRET).ask(f"localhost:{port}") is not None


def test_a_connection_that_sends_nothing_is_closed_after_the_read_timeout(served, caplog, monkeypatch, quick_warnings):
    monkeypatch.setattr(control_lib, "PROOF_TIMEOUT", 0.5)
    _, _, port = served
    with _raw(port) as conn:
        _greeting(conn)
        assert _read_all(conn) == b"", "closed by the server, not by this test's 30 s timeout"
    assert any("no valid request (no complete line in time)" in r.getMessage() for r in caplog.records)


def test_connections_held_open_without_the_secret_cannot_keep_the_runs_own_out(
    served, caplog, monkeypatch, quick_warnings
):
    """Whoever reaches the port and holds connections open, never proving the run's secret, does not take the places
    of the run's own: the one that waited longest makes room, and the run's poll is answered at its first try."""
    monkeypatch.setattr(control_lib, "PROOF_TIMEOUT", 60.0)  # held connections stay until made room for
    control, _, port = served
    held = [_raw(port) for _ in range(4 * control.max_unproven)]
    asker = Control(free_ports(1)[0], [], secret=SECRET)
    try:
        assert asker.ask(f"localhost:{port}") == PeerState(1, "formed", 2)
        closed = held[: len(held) - control.max_unproven + 1]
        for conn in closed:
            data = _read_all(conn)
            assert data == b"" or list(json.loads(data)) == ["nonce"], "closed, with its challenge at most"
        crowded = [r.getMessage() for r in caplog.records if "had not proved" in r.getMessage()]
        assert len(crowded) == len(closed) and crowded[0] == (
            f"control channel: closed a connection from 127.0.0.1:{held[0].getsockname()[1]}: it had not proved the "
            f"run's secret and {control.max_unproven} such connections were open"
        )
    finally:
        asker.close()
        for conn in held:
            conn.close()


def test_every_peers_poll_at_once_is_served_in_a_cluster_of_40(tmp_path):
    assert connection_limits(1) == (5, 6) and connection_limits(63) == (67, 130)
    assert connection_limits(500) == (68, 132), "peers counted up to MAX_WORKERS"
    peers = [f"localhost:{p}" for p in range(1, 40)]
    port = free_ports(1)[0]
    control = Control(port, peers, secret=SECRET)
    try:
        control.set(2, "formed")
        polls = [_raw(port) for _ in peers]
        challenges = [_greeting(conn) for conn in polls]  # none is closed to make room for another
        for conn, challenge in zip(polls, challenges, strict=True):
            conn.sendall(_request(challenge, op="state"))
        answers = [PeerState.from_json(json.loads(_read_all(conn))) for conn in polls]
        assert answers == [PeerState(2, "formed", 0)] * len(peers)
    finally:
        for conn in polls:
            conn.close()
        control.close()


def test_state_and_a_checkpoint_cross_the_channel_over_ipv6(tmp_path):
    ports = free_ports(2, "::1")
    survivor_home = CheckpointHome(str(tmp_path / "survivor" / "worker-0"))
    os.makedirs(survivor_home.uri)
    payload = os.urandom(2 << 20)
    for name in ("ckpt-3.index", "ckpt-3.data-00000-of-00001"):
        with open(f"{survivor_home.uri}/{name}", "wb") as f:
            f.write(payload)
    sent = survivor_home.commit(3, [{"epoch": e} for e in (1, 2, 3)])
    spec = {"worker": [f"[::1]:{p}" for p in ports]}
    tf_config = {"cluster": {"worker": ["[::1]:1", "[::1]:3"]}}
    survivor = Control.of_task(
        spec,
        dict(tf_config, task={"type": "worker", "index": 0}),
        survivor_home.epoch,
        survivor_home.send,
        secret=SECRET,
    )
    replacement_home = CheckpointHome(str(tmp_path / "replacement" / "worker-1"))
    replacement = Control.of_task(spec, dict(tf_config, task={"type": "worker", "index": 1}), secret=SECRET)
    try:
        survivor.set(0, "failed")
        assert replacement.peer_states() == {f"[::1]:{ports[0]}": PeerState(0, "failed", 3)}
        handover = replacement_home.hand_over(3)
        assert replacement.fetch(f"[::1]:{ports[0]}", 3, handover.receive, handover.resume_point()) == sent
        assert survivor.peer_states() == {f"[::1]:{ports[1]}": PeerState(0, "starting", 0)}
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=5) as conn:
            assert _greeting(conn), "one socket serves IPv4 too (dual-stack)"
    finally:
        survivor.close()
        replacement.close()
    assert replacement_home.latest() == sent
    with open(f"{replacement_home.uri}/ckpt-3.data-00000-of-00001", "rb") as f:
        assert f.read() == payload


def test_a_channel_needs_the_runs_secret_and_the_record_carries_it_but_its_metadata_does_not(tmp_path):
    for secret in ("", "short"):
        with pytest.raises(UsageError, match="holds no control secret for the run"):
            Control(free_ports(1)[0], [], secret=secret)
    record = ClusterRecord.new({"worker": ["a:1", "b:1"]}, {"worker": ["a:2", "b:2"]}, "kubernetes")
    assert (
        len(record.secret) == 64 and record.secret != ClusterRecord.new(record.cluster, record.control, "local").secret
    )
    assert "secret" not in record.to_json() and record.secret not in repr(record)
    record.write(str(tmp_path))
    assert ClusterRecord.read(str(tmp_path)) == record
    assert os.stat(tmp_path / "cluster.json").st_mode & 0o077 == 0, "only its owner reads the file"
    old = json.loads((tmp_path / "cluster.json").read_text())
    del old["secret"]
    (tmp_path / "cluster.json").write_text(json.dumps(old))
    with pytest.raises(UsageError, match=r"cluster file '\S+cluster.json' has no control secret: it was written by an"):
        ClusterRecord.read(str(tmp_path))
    assert ClusterRecord.new({"worker": ["a:1"]}, {}, "local").secret == "", "no channel, no secret"


_WRITE_A_RECORD = """
import json, os, stat, sys
from trainer.cluster.cluster_record import ClusterRecord

modes = []

def before_rename(event, args):
    if event == "os.rename" and os.path.basename(str(args[0])).startswith("cluster.json"):
        modes.append(oct(stat.S_IMODE(os.stat(args[0]).st_mode)))

sys.addaudithook(before_rename)
os.umask(0)
ClusterRecord.new({"worker": ["a:1", "b:1"]}, {"worker": ["a:2", "b:2"]}, "kubernetes").write(sys.argv[1])
print(json.dumps(modes))
"""


def test_cluster_json_is_its_owners_alone_from_its_first_byte(tmp_path):
    """Made readable by others and then chmodded, a reader could open it in between: it is created 0600 (here under
    umask 0, which opens every other file to all) and renamed into place so; the audit hook looks as it is renamed."""
    from tests.support.paths import ROOT

    result = subprocess.run(
        [sys.executable, "-c", _WRITE_A_RECORD, str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["0o600"], "the temporary file was its owner's alone when renamed"
    assert os.stat(tmp_path / "cluster.json").st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["cluster.json"], "no temporary file left"


def test_addresses_in_brackets_are_ipv6_and_bare_ones_are_refused():
    from trainer.cluster.topology import build_tf_config, connect_host, next_port, split_address

    assert split_address("[::1]:2222") == ("[::1]", 2222) and connect_host("[::1]") == "::1"
    assert next_port("[fd00::5]:2222") == "[fd00::5]:2223"
    assert build_tf_config(["[::1]:2222", "[::1]:2224"], "worker", 1)["cluster"] == {
        "worker": ["[::1]:2222", "[::1]:2224"]
    }
    with pytest.raises(UsageError, match=r"address '::1:2222': an IPv6 host goes in brackets, as in \[::1\]:2222"):
        split_address("::1:2222")


def test_a_task_started_by_hand_without_the_secret_is_refused_with_one_line(tmp_path):
    from tests.support.processes import run_module, trainer_args

    tf_config = {"cluster": {"worker": ["localhost:5001", "localhost:5003"]}, "task": {"type": "worker", "index": 0}}
    result = run_module(
        "trainer.train",
        *trainer_args(tmp_path / "data", tmp_path / "model", "--max-restarts", "1", "--run-id", "by-hand"),
        env={"TF_CONFIG": json.dumps(tf_config), "TRAINER_CONTROL_SECRET": "too short"},
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: the environment variable TRAINER_CONTROL_SECRET holds no control secret for the run (or one shorter "
        "than 32 characters); allowed: the secret the run's cluster step or trainer-launch generated, or for tasks "
        "started by hand the same TRAINER_CONTROL_SECRET (at least 32 characters) in every task's environment"
    ]
    assert not (tmp_path / "model").exists()


def test_the_supervisor_states_are_an_enum_and_cross_the_channel_as_their_old_strings():
    from trainer.cluster.control import State

    assert [s.value for s in State] == ["starting", "fetching", "running", "formed", "failed", "done"]
    assert [s for s in State if s.is_terminal] == [State.FAILED, State.DONE]
    assert [s for s in State if s.is_live] == [State.RUNNING, State.FORMED]
    state = PeerState(2, State.FETCHING, 3)
    assert state.to_json() == {"generation": 2, "state": "fetching", "checkpoint": 3}
    assert json.dumps(state.to_json()) == '{"generation": 2, "state": "fetching", "checkpoint": 3}'
    assert PeerState.from_json({"generation": 2, "state": "fetching", "checkpoint": 3}) == state
    with pytest.raises(ValueError, match="not a supervisor state"):
        PeerState.from_json({"generation": 2, "state": "waiting"})
