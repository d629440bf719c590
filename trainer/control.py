"""The control channel between the supervisors of a run's workers: how they converge on each restart.

Each supervisor serves its generation (how many times its training process has started over) and its state
(starting, running, failed, done) on a TCP port beside its task's TF port, and asks its peers for theirs.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from trainer.cluster import split_address
from trainer.errors import StartupTimeoutError

PEER_POLL_SECONDS = 1.0


class Control:
    """This supervisor's generation and state, served on a TCP port, and its view of the peers' supervisors."""

    def __init__(self, listen_port: int, peers: Sequence[str]) -> None:
        self.peers = list(peers)
        self.generation = 0
        self.state = "starting"
        self._server = socket.create_server(("", listen_port), reuse_port=False)
        self._server.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="supervisor-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                try:
                    conn.sendall(json.dumps({"generation": self.generation, "state": self.state}).encode() + b"\n")
                except OSError:
                    pass

    def set(self, generation: int, state: str) -> None:
        """Publishes this supervisor's generation and state to its peers."""
        self.generation, self.state = generation, state

    def close(self) -> None:
        """Stops serving the control channel."""
        self._stop.set()
        self._server.close()
        self._thread.join(timeout=2)

    def peer_states(self) -> dict[str, dict[str, Any] | None]:
        """Each peer's `{"generation", "state"}`, or None when its supervisor does not answer."""
        return {address: _ask(address) for address in self.peers}

    def first_generation(self) -> int:
        """Where a (re)started supervisor joins: the peers' current generation, or the next after a failed one."""
        generations = [s["generation"] + (s["state"] == "failed") for s in self.peer_states().values() if s]
        return max(generations, default=0)

    def barrier(self, generation: int, timeout: float) -> None:
        """Waits until no peer's child of an older generation is still running."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.peer_states()
            blocking = [
                a for a, s in states.items() if s is None or (s["generation"] < generation and s["state"] == "running")
            ]
            if not blocking:
                return
            if time.monotonic() >= deadline:
                raise StartupTimeoutError(
                    f"restart {generation}: peers did not stop their previous attempt within "
                    f"{timeout:g}s: {', '.join(blocking)}"
                )
            time.sleep(PEER_POLL_SECONDS)

    def failed_peer(self, generation: int) -> str | None:
        """The first peer whose attempt of this generation failed or that has moved on to a later one."""
        for address, s in self.peer_states().items():
            if s and (s["generation"] > generation or (s["generation"] == generation and s["state"] == "failed")):
                return address
        return None


def _ask(address: str) -> dict[str, Any] | None:
    host, port = split_address(address)
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=1.0) as conn:
            conn.settimeout(1.0)
            return json.loads(conn.makefile().readline())
    except (OSError, ValueError):
        return None
