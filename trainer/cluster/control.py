"""The control channel between the supervisors of a run's workers: how they converge on each (re)start.

Each supervisor serves, on a TCP port beside its task's TF port, its generation (how many times its training
process has started over), its state and the epoch of its latest checkpoint, and asks its peers for theirs. One
request per connection, JSON lines:

    <- {"nonce": S}                                    the server's challenge, sent as soon as it accepts
    -> {"op": "state", "nonce": C, "mac": M}           M: HMAC-SHA256 of the request and S under the run's secret
    <- {"generation": 1, "state": "formed", "checkpoint": 3, "mac": ...}      sealed with C
    -> {"op": "fetch", "epoch": 3, "offset": N, "sha256": H, "nonce": C, "mac": M}
    <- the checkpoint of epoch 3 from byte N on (`trainer.cluster.resume.CheckpointHome.send`), its header and
       trailer sealed with a key of this connection (the secret and both nonces)

The channel belongs to the run: only a process holding the run's secret (`new_secret`, written by the cluster step
into the run's cluster record, or by `trainer-launch` into its workers' environment) gets an answer. A request
without a valid proof of it, a request line longer than `MAX_LINE` bytes or one not sent within `PROOF_TIMEOUT`
closes the connection with one warning naming the peer's address, and never streams a checkpoint. Answers are
sealed too, so a task only believes its own run's peers. It listens on IPv6 and IPv4 (one dual-stack socket), or
on IPv4 alone where the pod has no IPv6.

Connections are counted in two pools, both sized by the cluster (`connection_limits`). A connection that has not
yet proved the secret has `PROOF_TIMEOUT` to do so and is one of at most one per peer and 4 more (every peer's poll
at once fits); when one more comes, the one that has waited longest is closed to make room, so whoever reaches the
port cannot keep the run's own requests out by holding connections open, only by opening them faster than the
run's prove themselves (milliseconds): a flood, which only the network can stop. A proved connection is one of at
most two per peer and 4 more (a poll and a fetch from each), `MAX_SENDS` of them checkpoints; more are closed at
once.

States: `starting` (no training process yet: waiting for peers, agreeing where to resume), `fetching` (receiving
a peer's checkpoint: the peers' start-up watchdogs wait for it), `running` (the process is joining the cluster),
`formed` (the cluster formed: training), `failed`, `done`. A supervisor that comes up while a peer's cluster has
already formed is a replacement for a lost task: it joins the next generation, which makes the survivors stop their
processes at once and restart together with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import errno
import hashlib
import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from trainer.cluster import topology
from trainer.cluster.topology import connect_host, split_address
from trainer.config.contract import MAX_WORKERS
from trainer.core.errors import PeerFinishedError, PeerUnavailableError, StartupTimeoutError, UsageError

log = logging.getLogger(__name__)

ADDRESSES_ENV = "TRAINER_CONTROL"
SECRET_ENV = "TRAINER_CONTROL_SECRET"
MIN_SECRET_CHARS = 32
PEER_POLL_SECONDS = 1.0
ASK_TIMEOUT = 2.0
PROOF_TIMEOUT = 1.0
STALL_TIMEOUT = 60.0
MAX_LINE = 4096
MAX_SENDS = 4
WARN_EVERY_SECONDS = 10.0
_NONCE_CHARS = 32


class State(str, enum.Enum):
    """A supervisor's state as it crosses the control channel (its value is the wire format)."""

    STARTING = "starting"
    """No training process yet: waiting for the peers, agreeing where to resume."""
    FETCHING = "fetching"
    """Receiving a peer's checkpoint: the peers' start-up watchdogs wait for it."""
    RUNNING = "running"
    """The process is joining the cluster."""
    FORMED = "formed"
    """The cluster formed: training."""
    FAILED = "failed"
    """The process of this generation failed."""
    DONE = "done"
    """The process succeeded: the task is over."""

    @property
    def is_terminal(self) -> bool:
        """Whether this generation's process has ended (failed or done)."""
        return self in (State.FAILED, State.DONE)

    @property
    def is_live(self) -> bool:
        """Whether this generation's process runs (joining or training)."""
        return self in (State.RUNNING, State.FORMED)


class LineTooLongError(ValueError):
    """A peer sent a line longer than allowed."""


def connection_limits(peers: int) -> tuple[int, int]:
    """How many connections a supervisor with `peers` peers holds at once: (not yet proved, proved).

    Unproved: one per peer (a peer's polls come one at a time) and 4 more; proved: two per peer (a poll and a
    fetch) and 4 more; peers counted up to `MAX_WORKERS`. A cluster of 2 workers: (5, 6); of 64: (67, 130).
    """
    counted = min(max(peers, 1), MAX_WORKERS)
    return counted + 4, 2 * counted + 4


def new_secret() -> str:
    """A fresh secret for one run's control channel (64 hex digits)."""
    return secrets.token_hex(32)


def check_secret(secret: Any, where: str) -> str:
    """The run's control secret, checked (never named in the message).

    Raises:
        UsageError: `where` holds none, or one shorter than `MIN_SECRET_CHARS`.
    """
    if not isinstance(secret, str) or len(secret.strip()) < MIN_SECRET_CHARS:
        raise UsageError(
            f"{where} holds no control secret for the run (or one shorter than {MIN_SECRET_CHARS} characters); "
            "allowed: the secret the run's cluster step or trainer-launch generated, or for tasks started by hand "
            f"the same {SECRET_ENV} (at least {MIN_SECRET_CHARS} characters) in every task's environment"
        )
    return secret.strip()


def seal(key: bytes, label: str, data: Any) -> str:
    """An HMAC-SHA256 of `data` (as canonical JSON) under `key`, bound to `label` (what the data is)."""
    body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, label.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def sealed(key: bytes, label: str, data: Mapping[str, Any]) -> bool:
    """Whether `data["mac"]` is `seal` of the rest of `data`."""
    mac = data.get("mac")
    rest = {k: v for k, v in data.items() if k != "mac"}
    return isinstance(mac, str) and hmac.compare_digest(mac, seal(key, label, rest))


def read_line(conn: socket.socket, limit: int, deadline: float) -> bytes:
    """One line from `conn` (without its newline), read by `deadline` (a `time.monotonic()` value).

    Raises:
        LineTooLongError: more than `limit` bytes came without a newline.
        TimeoutError: the line did not come in time.
        ConnectionError: the peer closed the connection first.
    """
    buffer = bytearray()
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete line in time")
        conn.settimeout(left)
        try:
            chunk = conn.recv(limit + 1 - len(buffer))
        except TimeoutError:
            raise TimeoutError("no complete line in time") from None
        if not chunk:
            raise ConnectionError(f"the connection closed after {len(buffer)} bytes of a line")
        buffer += chunk
        end = buffer.find(b"\n")
        if end >= 0:
            return bytes(buffer[:end])
        if len(buffer) > limit:
            raise LineTooLongError(f"a line longer than {limit} bytes")


def _line(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


def _transfer_key(secret: bytes, server_nonce: str, client_nonce: str) -> bytes:
    return hmac.new(secret, f"transfer\n{server_nonce}\n{client_nonce}".encode(), hashlib.sha256).digest()


def _is_nonce(value: Any) -> bool:
    return isinstance(value, str) and len(value) == _NONCE_CHARS and all(c in "0123456789abcdef" for c in value)


def peer_name(peer: Any) -> str:
    """`host:port` (`[v6]:port`) of a peer as `accept` gives it; IPv4 peers of a dual-stack socket unmapped."""
    host, port = str(peer[0]), peer[1]
    if host.startswith("::ffff:") and "." in host:
        host = host.removeprefix("::ffff:")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(port: int) -> socket.socket:
    """A listening TCP socket on every interface: dual-stack (IPv6 and IPv4) where the host has IPv6, else IPv4."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise
            log.info("control channel: no IPv6 here (%s); listening on IPv4 only", err.strerror or err)
    return socket.create_server(("", port))


def connect(address: str, timeout: float) -> socket.socket:
    """A TCP connection to `host:port` or `[v6]:port`."""
    host, port = split_address(address)
    return socket.create_connection((connect_host(host), port), timeout=timeout)


class _Warnings:
    """Warnings of one kind at most once per `WARN_EVERY_SECONDS`, with a count of those left out."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, kind: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, left_out = self._last.get(kind, (float("-inf"), 0))
            if now - last < WARN_EVERY_SECONDS:
                self._last[kind] = (last, left_out + 1)
                return
            self._last[kind] = (now, 0)
        more = f" ({left_out} more like it in the last {now - last:.0f}s)" if left_out else ""
        log.warning("control channel: %s%s", message, more)


@dataclasses.dataclass(frozen=True)
class PeerState:
    """What a supervisor publishes: its generation, its state and the epoch of its latest checkpoint (0: none)."""

    generation: int
    state: State
    checkpoint: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", State(self.state))

    def to_json(self) -> dict[str, Any]:
        """The state as it crosses the channel."""
        return {"generation": self.generation, "state": self.state.value, "checkpoint": self.checkpoint}

    @classmethod
    def from_json(cls, data: Any) -> PeerState:
        """The state a peer sent; ValueError when it is not one."""
        states = {state.value for state in State}
        if not isinstance(data, dict) or data.get("state") not in states or not isinstance(data.get("generation"), int):
            raise ValueError(f"not a supervisor state: {data!r}")
        return cls(data["generation"], State(data["state"]), int(data.get("checkpoint") or 0))


class Control:
    """This supervisor's state served on a TCP port, and its view of the peers' supervisors.

    Args:
        listen_port: the port to serve on (all interfaces, IPv6 and IPv4).
        peers: the peers' control addresses (`host:port`, `[v6]:port`).
        checkpoint: returns the epoch of this task's latest checkpoint, read when a peer asks.
        send_checkpoint: streams the checkpoint of an epoch (`CheckpointHome.send`: epoch, stream, key, offset,
            sha256 of the bytes before the offset).
        secret: the run's control secret; every request and answer proves it.
    """

    def __init__(
        self,
        listen_port: int,
        peers: Sequence[str],
        checkpoint: Callable[[], int] = lambda: 0,
        send_checkpoint: Callable[[int, IO[bytes], bytes, int, str], None] | None = None,
        *,
        secret: str,
    ) -> None:
        self._secret = check_secret(secret, "the control channel").encode()
        self.peers = list(peers)
        self.generation = 0
        self.state = State.STARTING
        # Peers last seen `done`: their supervisors end and stop answering, which is not a lost pod.
        self.finished: set[str] = set()
        # What each peer answered at the last `peer_states`.
        self.last_states: dict[str, PeerState | None] = {}
        self._checkpoint = checkpoint
        self._send_checkpoint = send_checkpoint
        self._warn = _Warnings()
        self.max_unproven, self.max_proven = connection_limits(len(self.peers))
        self._proven = threading.BoundedSemaphore(self.max_proven)
        # Connections that have not proved the secret yet, oldest first, with their peers' addresses.
        self._unproven: dict[socket.socket, str] = {}
        self._unproven_lock = threading.Lock()
        self._sends = threading.BoundedSemaphore(MAX_SENDS)
        self._server = listen(listen_port)
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="supervisor-control", daemon=True)
        self._thread.start()

    @classmethod
    def of_task(
        cls,
        spec: Mapping[str, Sequence[str]],
        tf_config: Mapping[str, Any],
        checkpoint: Callable[[], int] = lambda: 0,
        send_checkpoint: Callable[[int, IO[bytes], bytes, int, str], None] | None = None,
        *,
        secret: str,
    ) -> Control:
        """The control channel of the task `tf_config` names.

        It serves on the task's address in `spec` (the supervisors' addresses, shaped like the cluster); every other
        address of `spec` is a peer.
        """
        task = tf_config["task"]
        own = spec[task["type"]][task["index"]]
        peers = [address for job in spec.values() for address in job if address != own]
        return cls(split_address(own)[1], peers, checkpoint, send_checkpoint, secret=secret)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._server.accept()
            except (TimeoutError, OSError):
                continue
            name = peer_name(peer)
            with self._unproven_lock:
                crowded = next(iter(self._unproven.items())) if len(self._unproven) >= self.max_unproven else None
                if crowded is not None:
                    del self._unproven[crowded[0]]
                    # Under the lock: its own thread closes it only after finding it gone from `_unproven`.
                    with contextlib.suppress(OSError):
                        crowded[0].shutdown(socket.SHUT_RDWR)
                self._unproven[conn] = name
            if crowded is not None:
                self._warn(
                    "crowded",
                    f"closed a connection from {crowded[1]}: it had not proved the run's secret and "
                    f"{self.max_unproven} such connections were open",
                )
            threading.Thread(
                target=self._answer, args=(conn, name), name="supervisor-control-peer", daemon=True
            ).start()

    def _crowded_out(self, conn: socket.socket, leave: bool = False) -> bool:
        """Whether `conn` was closed to make room for a newer unproven one; with `leave`, no longer unproven."""
        with self._unproven_lock:
            if leave:
                return self._unproven.pop(conn, None) is None
            return conn not in self._unproven

    def _answer(self, conn: socket.socket, peer: str) -> None:
        proven = crowded_out = False
        try:
            with conn:
                try:
                    challenge = secrets.token_hex(_NONCE_CHARS // 2)
                    conn.settimeout(PROOF_TIMEOUT)
                    conn.sendall(_line({"nonce": challenge}))
                    request = self._request(conn, peer, challenge)
                finally:
                    crowded_out = self._crowded_out(conn, leave=True)
                if request is None or crowded_out:
                    return
                if not self._proven.acquire(blocking=False):
                    self._warn(
                        "busy", f"closed a connection from {peer}: {self.max_proven} of the run's connections are open"
                    )
                    return
                proven = True
                conn.settimeout(ASK_TIMEOUT)
                if request["op"] == "fetch":
                    self._send(conn, peer, request, _transfer_key(self._secret, challenge, request["nonce"]))
                    return
                state = self.own_state().to_json()
                state["mac"] = seal(self._secret, f"state\n{request['nonce']}", state)
                conn.sendall(_line(state))
        except Exception as err:  # noqa: BLE001 - a peer's bad or broken request must not stop the server
            if proven:
                log.warning("control channel: a request from %s failed: %s", peer, err)
            elif not crowded_out:
                self._warn("failed", f"a request from {peer} failed: {err}")
        finally:
            if proven:
                self._proven.release()

    def _request(self, conn: socket.socket, peer: str, challenge: str) -> dict[str, Any] | None:
        """The peer's request when it proves the run's secret; None (and one warning) when it does not."""
        try:
            request = json.loads(read_line(conn, MAX_LINE, time.monotonic() + PROOF_TIMEOUT))
        except LineTooLongError:
            self._warn("long", f"closed a connection from {peer}: its request is longer than {MAX_LINE} bytes")
            return None
        except (TimeoutError, ConnectionError, ValueError) as err:
            if not self._crowded_out(conn):
                self._warn("bad", f"closed a connection from {peer}: no valid request ({err})")
            return None
        if not (isinstance(request, dict) and _is_nonce(request.get("nonce")) and self._valid(request, challenge)):
            self._warn("secret", f"closed a connection from {peer}: its request does not prove the run's secret")
            return None
        return request

    def _valid(self, request: dict[str, Any], challenge: str) -> bool:
        if not sealed(self._secret, f"request\n{challenge}", request):
            return False
        if request.get("op") == "state":
            return True
        epoch, offset, prefix = request.get("epoch"), request.get("offset"), request.get("sha256")
        return (
            request.get("op") == "fetch"
            and type(epoch) is int
            and epoch >= 1
            and type(offset) is int
            and offset >= 0
            and isinstance(prefix, str)
        )

    def _send(self, conn: socket.socket, peer: str, request: dict[str, Any], key: bytes) -> None:
        if self._send_checkpoint is None:
            conn.sendall(_line({"error": "this supervisor hands over no checkpoints"}))
            return
        if not self._sends.acquire(blocking=False):
            conn.sendall(_line({"error": f"busy: {MAX_SENDS} hand-overs in progress"}))
            return
        try:
            conn.settimeout(STALL_TIMEOUT)
            with conn.makefile("wb") as out:
                log.info(
                    "control channel: sending the checkpoint of epoch %d to %s from byte %d",
                    request["epoch"],
                    peer,
                    request["offset"],
                )
                try:
                    self._send_checkpoint(request["epoch"], out, key, request["offset"], request["sha256"])
                except FileNotFoundError as err:
                    out.write(_line({"error": str(err)}))
                out.flush()
        finally:
            self._sends.release()

    def own_state(self) -> PeerState:
        """This supervisor's state, with the epoch of its latest checkpoint read now."""
        try:
            checkpoint = self._checkpoint()
        except Exception as err:  # noqa: BLE001 - an unreadable home counts as no checkpoint
            log.warning("cannot read this task's checkpoint: %s", err)
            checkpoint = 0
        return PeerState(self.generation, self.state, checkpoint)

    def set(self, generation: int, state: State | str) -> None:
        """Publishes this supervisor's generation and state to its peers.

        Raises:
            ValueError: `state` is not a `State` (or a value of one).
        """
        self.generation, self.state = generation, State(state)

    def close(self, linger: float = 0.0) -> None:
        """Stops serving the control channel, after `linger` seconds in which peers can still read the final state.

        A supervisor that is done lingers for two of its peers' polls, so each sees `done` (a finished peer) before
        the channel closes, rather than a peer that stopped answering (a lost one).
        """
        if linger > 0:
            self._stop.wait(linger)
        self._stop.set()
        self._server.close()
        self._thread.join(timeout=2)

    def _open(self, address: str, request: dict[str, Any]) -> tuple[socket.socket, str, str]:
        """Connects to `address` and answers its challenge with `request`, sealed.

        Returns:
            The connection, the peer's challenge and this request's nonce.
        """
        conn = connect(address, ASK_TIMEOUT)
        try:
            greeting = json.loads(read_line(conn, MAX_LINE, time.monotonic() + ASK_TIMEOUT))
            challenge = greeting.get("nonce") if isinstance(greeting, dict) else None
            if not _is_nonce(challenge):
                raise ValueError(f"{address} does not speak the control protocol")
            nonce = secrets.token_hex(_NONCE_CHARS // 2)
            body = dict(request, nonce=nonce)
            body["mac"] = seal(self._secret, f"request\n{challenge}", body)
            conn.sendall(_line(body))
            return conn, challenge, nonce
        except BaseException:
            conn.close()
            raise

    def ask(self, address: str) -> PeerState | None:
        """The state of the peer at `address`, or None when it does not answer (or not as one of the run's)."""
        try:
            conn, _, nonce = self._open(address, {"op": "state"})
            with conn:
                answer = json.loads(read_line(conn, MAX_LINE, time.monotonic() + ASK_TIMEOUT))
            if not isinstance(answer, dict) or not sealed(self._secret, f"state\n{nonce}", answer):
                self._warn("unsealed", f"the supervisor at {address} does not answer with the run's secret")
                return None
            return PeerState.from_json(answer)
        except (OSError, ValueError):
            return None

    def peer_states(self) -> dict[str, PeerState | None]:
        """Each peer's state, or None when its supervisor does not answer; peers seen `done` are kept as finished."""
        states = {address: self.ask(address) for address in self.peers}
        for address, state in states.items():
            if state is not None and state.state is State.DONE:
                self.finished.add(address)
            elif state is not None:
                self.finished.discard(address)
        self.last_states = states
        return states

    def first_generation(self) -> int:
        """Where a (re)started supervisor joins.

        A peer whose cluster formed, or whose attempt failed, is about to start the next generation without this
        task's old process (a replacement joins that one); a peer that is starting or joining waits for this task
        (join its generation).
        """
        generations = [
            s.generation + (s.state in (State.FORMED, State.FAILED))
            for s in self.peer_states().values()
            if s is not None
        ]
        return max(generations, default=0)

    def barrier(self, generation: int, deadline: float) -> dict[str, PeerState]:
        """Waits until every peer answers and none still runs a training process of an older generation.

        Returns:
            The peers' states at that moment: none of their checkpoints changes until this generation trains.

        Raises:
            StartupTimeoutError: `deadline` (a `time.monotonic()` value) passed first; names the peers waited for.
        """
        while True:
            states = self.peer_states()
            done = [a for a, s in states.items() if a in self.finished and (s is None or s.state is State.DONE)]
            if done:
                raise PeerFinishedError(
                    f"generation {generation}: the peers at {', '.join(done)} finished successfully, so a restart "
                    "would wait for them forever; not restarting"
                )
            blocking = [a for a, s in states.items() if s is None or (s.generation < generation and s.state.is_live)]
            if not blocking:
                return {a: s for a, s in states.items() if s is not None}
            if time.monotonic() >= deadline:
                silent = [a for a in blocking if states[a] is None]
                old = [a for a in blocking if states[a] is not None]
                parts = []
                if silent:
                    parts.append("no supervisor answers at " + ", ".join(silent))
                if old:
                    parts.append("still running an older attempt: " + ", ".join(old))
                raise StartupTimeoutError(f"generation {generation}: peers not ready in time: {'; '.join(parts)}")
            time.sleep(PEER_POLL_SECONDS)

    def failed_peer(self, generation: int) -> str | None:
        """The first peer whose attempt of this generation failed or that has moved on to a later one."""
        for address, s in self.peer_states().items():
            if s and (s.generation > generation or (s.generation == generation and s.state is State.FAILED)):
                return address
        return None

    def fetching_peer(self, generation: int) -> str | None:
        """The first peer that, at the last `peer_states`, was receiving a checkpoint for this generation."""
        for address, s in self.last_states.items():
            if s and s.generation == generation and s.state is State.FETCHING:
                return address
        return None

    def lost_peer(self, generation: int) -> str | None:
        """The first peer that `failed_peer` names or whose supervisor does not answer at all (a lost pod).

        A peer that finished successfully is finished, not lost, also once its supervisor has ended.
        """
        for address, s in self.peer_states().items():
            if s is None and address in self.finished:
                continue
            if s is None or s.generation > generation or (s.generation == generation and s.state is State.FAILED):
                return address
        return None

    def fetch(
        self,
        address: str,
        epoch: int,
        receive: Callable[[IO[bytes], str, bytes], Any],
        resume: tuple[int, str] = (0, ""),
        timeout: float = STALL_TIMEOUT,
    ) -> Any:
        """Asks the peer at `address` for its checkpoint of `epoch` and hands the stream to `receive`.

        Args:
            address: the peer's control address.
            epoch: the checkpoint's epoch.
            receive: reads the stream (`HandOver.receive`: stream, address, this transfer's key).
            resume: the bytes already received from an earlier, broken transfer and their SHA-256; the peer sends
                from there when its own first bytes match, else from the start.
            timeout: seconds the stream may go without a byte.

        Raises:
            PeerUnavailableError: the peer cannot be reached, is not one of the run's, or the transfer broke
                (retryable).
        """
        offset, prefix = resume
        request = {"op": "fetch", "epoch": epoch, "offset": offset, "sha256": prefix}
        try:
            conn, challenge, nonce = self._open(address, request)
        except (OSError, ValueError) as err:
            raise self._unavailable(epoch, address, err) from None
        try:
            with conn:
                conn.settimeout(timeout)
                with conn.makefile("rb") as stream:
                    return receive(stream, address, _transfer_key(self._secret, challenge, nonce))
        except OSError as err:
            raise self._unavailable(epoch, address, err) from None

    @staticmethod
    def _unavailable(epoch: int, address: str, err: Exception) -> PeerUnavailableError:
        detail = (err.strerror if isinstance(err, OSError) else None) or str(err) or type(err).__name__
        return PeerUnavailableError(f"cannot fetch the checkpoint of epoch {epoch} from {address}: {detail}")


def addresses(tf_config: Mapping[str, Any], text: str) -> dict[str, list[str]]:
    """The supervisors' control addresses, shaped like the TF_CONFIG cluster.

    `text` is `TRAINER_CONTROL` (JSON shaped like the cluster); empty: each task's TF address with the next port,
    as in the pipeline's Kubernetes mode.

    Raises:
        UsageError: `text` is not shaped like the cluster, or a derived address is another task's TF address.
    """
    cluster = tf_config["cluster"]
    if text.strip():
        spec = topology.validate_cluster(_parse(text))
        if {job: len(a) for job, a in spec.items()} != {job: len(a) for job, a in cluster.items()}:
            raise UsageError(f"{ADDRESSES_ENV} {text[:120]!r} does not have the shape of the TF_CONFIG cluster")
        return spec
    spec = topology.validate_cluster(
        {job: [topology.next_port(a) for a in addresses] for job, addresses in cluster.items()}
    )
    taken = set(topology.task_order(cluster))
    clashes = [a for a in topology.task_order(spec) if a in taken]
    if clashes:
        raise UsageError(
            f"control address {clashes[0]} (a task's TF port + 1) is another task's TF address; allowed: TF ports "
            f"at least 2 apart, or {ADDRESSES_ENV} naming the supervisors' addresses, shaped like the cluster"
        )
    return spec


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{ADDRESSES_ENV} is not valid JSON ({err.msg}): {text[:80]!r}") from None
