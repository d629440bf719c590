"""The control channel between the supervisors of a run's workers: how they converge on each (re)start.

Each supervisor serves, on a TCP port beside its task's TF port, its generation (how many times its training
process has started over), its state and the epoch of its latest checkpoint, and asks its peers for theirs:

    -> {"op": "state"}                 <- {"generation": 1, "state": "formed", "checkpoint": 3}
    -> {"op": "fetch", "epoch": 3}     <- the checkpoint of epoch 3 (`trainer.cluster.resume.CheckpointHome.send`)

States: `starting` (no training process yet: waiting for peers, agreeing where to resume), `running` (the process
is joining the cluster), `formed` (the cluster formed: training), `failed`, `done`. A supervisor that comes up
while a peer's cluster has already formed is a replacement for a lost task: it joins the next generation, which
makes the survivors stop their processes at once and restart together with it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainer.cluster import tf_config as tf_config_lib
from trainer.cluster.tf_config import split_address
from trainer.core.errors import PeerFinishedError, PeerUnavailableError, StartupTimeoutError, UsageError

log = logging.getLogger(__name__)

ADDRESSES_ENV = "TRAINER_CONTROL"
PEER_POLL_SECONDS = 1.0
ASK_TIMEOUT = 2.0
FETCH_TIMEOUT = 60.0
STATES = ("starting", "running", "formed", "failed", "done")
LIVE = ("running", "formed")


@dataclasses.dataclass(frozen=True)
class PeerState:
    """What a supervisor publishes: its generation, its state and the epoch of its latest checkpoint (0: none)."""

    generation: int
    state: str
    checkpoint: int = 0

    def to_json(self) -> dict[str, Any]:
        """The state as it crosses the channel."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> PeerState:
        """The state a peer sent; ValueError when it is not one."""
        if not isinstance(data, dict) or data.get("state") not in STATES or not isinstance(data.get("generation"), int):
            raise ValueError(f"not a supervisor state: {data!r}")
        return cls(data["generation"], data["state"], int(data.get("checkpoint") or 0))


class Control:
    """This supervisor's state served on a TCP port, and its view of the peers' supervisors.

    Args:
        listen_port: the port to serve on (all interfaces).
        peers: the peers' control addresses (`host:port`).
        checkpoint: returns the epoch of this task's latest checkpoint, read when a peer asks.
        send_checkpoint: writes the checkpoint of an epoch to a binary stream (`CheckpointHome.send`).
    """

    def __init__(
        self,
        listen_port: int,
        peers: Sequence[str],
        checkpoint: Callable[[], int] = lambda: 0,
        send_checkpoint: Callable[[int, Any], None] | None = None,
    ) -> None:
        self.peers = list(peers)
        self.generation = 0
        self.state = "starting"
        # Peers last seen `done`: their supervisors end and stop answering, which is not a lost pod.
        self.finished: set[str] = set()
        self._checkpoint = checkpoint
        self._send_checkpoint = send_checkpoint
        self._server = socket.create_server(("", listen_port), reuse_port=False)
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
        send_checkpoint: Callable[[int, Any], None] | None = None,
    ) -> Control:
        """The control channel of the task `tf_config` names.

        It serves on the task's address in `spec` (the supervisors' addresses, shaped like the cluster); every other
        address of `spec` is a peer.
        """
        task = tf_config["task"]
        own = spec[task["type"]][task["index"]]
        peers = [address for job in spec.values() for address in job if address != own]
        return cls(split_address(own)[1], peers, checkpoint, send_checkpoint)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._answer, args=(conn,), name="supervisor-control-peer", daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader, conn.makefile("wb") as out:
            try:
                conn.settimeout(ASK_TIMEOUT)
                request = json.loads(reader.readline() or b"{}")
                conn.settimeout(FETCH_TIMEOUT)
                if request.get("op") == "fetch" and self._send_checkpoint is not None:
                    try:
                        self._send_checkpoint(int(request["epoch"]), out)
                    except FileNotFoundError as err:
                        out.write(json.dumps({"error": str(err)}).encode() + b"\n")
                else:
                    out.write(json.dumps(self.own_state().to_json()).encode() + b"\n")
                out.flush()
            except Exception as err:  # noqa: BLE001 - a peer's bad or broken request must not stop the server
                log.warning("control channel: a request failed: %s", err)

    def own_state(self) -> PeerState:
        """This supervisor's state, with the epoch of its latest checkpoint read now."""
        try:
            checkpoint = self._checkpoint()
        except Exception as err:  # noqa: BLE001 - an unreadable home counts as no checkpoint
            log.warning("cannot read this task's checkpoint: %s", err)
            checkpoint = 0
        return PeerState(self.generation, self.state, checkpoint)

    def set(self, generation: int, state: str) -> None:
        """Publishes this supervisor's generation and state to its peers."""
        self.generation, self.state = generation, state

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

    def peer_states(self) -> dict[str, PeerState | None]:
        """Each peer's state, or None when its supervisor does not answer; peers seen `done` are kept as finished."""
        states = {address: _ask(address) for address in self.peers}
        for address, state in states.items():
            if state is not None and state.state == "done":
                self.finished.add(address)
            elif state is not None:
                self.finished.discard(address)
        return states

    def first_generation(self) -> int:
        """Where a (re)started supervisor joins.

        A peer whose cluster formed, or whose attempt failed, is about to start the next generation without this
        task's old process (a replacement joins that one); a peer that is starting or joining waits for this task
        (join its generation).
        """
        generations = [
            s.generation + (s.state in ("formed", "failed")) for s in self.peer_states().values() if s is not None
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
            done = [a for a, s in states.items() if a in self.finished and (s is None or s.state == "done")]
            if done:
                raise PeerFinishedError(
                    f"generation {generation}: the peers at {', '.join(done)} finished successfully, so a restart "
                    "would wait for them forever; not restarting"
                )
            blocking = [a for a, s in states.items() if s is None or (s.generation < generation and s.state in LIVE)]
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
            if s and (s.generation > generation or (s.generation == generation and s.state == "failed")):
                return address
        return None

    def lost_peer(self, generation: int) -> str | None:
        """The first peer that `failed_peer` names or whose supervisor does not answer at all (a lost pod).

        A peer that finished successfully is finished, not lost, also once its supervisor has ended.
        """
        for address, s in self.peer_states().items():
            if s is None and address in self.finished:
                continue
            if s is None or s.generation > generation or (s.generation == generation and s.state == "failed"):
                return address
        return None

    def fetch(self, address: str, epoch: int, receive: Callable[[Any, str], Any]) -> Any:
        """Asks the peer at `address` for its checkpoint of `epoch` and hands the stream to `receive`.

        Raises:
            PeerUnavailableError: the peer cannot be reached or the transfer broke (retryable).
        """
        host, port = split_address(address)
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=ASK_TIMEOUT) as conn:
                conn.settimeout(FETCH_TIMEOUT)
                conn.sendall(json.dumps({"op": "fetch", "epoch": epoch}).encode() + b"\n")
                with conn.makefile("rb") as stream:
                    return receive(stream, address)
        except OSError as err:
            raise PeerUnavailableError(
                f"cannot fetch the checkpoint of epoch {epoch} from {address}: {err.strerror or err}"
            ) from None


def addresses(tf_config: Mapping[str, Any], text: str) -> dict[str, list[str]]:
    """The supervisors' control addresses, shaped like the TF_CONFIG cluster.

    `text` is `TRAINER_CONTROL` (JSON shaped like the cluster); empty: each task's TF address with the next port,
    as in the pipeline's Kubernetes mode.

    Raises:
        UsageError: `text` is not shaped like the cluster, or a derived address is another task's TF address.
    """
    cluster = tf_config["cluster"]
    if text.strip():
        spec = tf_config_lib.validate_cluster(_parse(text))
        if {job: len(a) for job, a in spec.items()} != {job: len(a) for job, a in cluster.items()}:
            raise UsageError(f"{ADDRESSES_ENV} {text[:120]!r} does not have the shape of the TF_CONFIG cluster")
        return spec
    spec = tf_config_lib.validate_cluster(
        {job: [tf_config_lib.next_port(a) for a in addresses] for job, addresses in cluster.items()}
    )
    taken = set(tf_config_lib.task_order(cluster))
    clashes = [a for a in tf_config_lib.task_order(spec) if a in taken]
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


def _ask(address: str) -> PeerState | None:
    host, port = split_address(address)
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=ASK_TIMEOUT) as conn:
            conn.settimeout(ASK_TIMEOUT)
            conn.sendall(b'{"op": "state"}\n')
            with conn.makefile("rb") as reader:
                return PeerState.from_json(json.loads(reader.readline()))
    except (OSError, ValueError):
        return None
