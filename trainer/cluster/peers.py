"""Naming the peers of a cluster that cannot be reached: what a start-up timeout or a lost peer reports."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.cluster.topology import Task, peers, split_address


def probe(address: str, timeout: float = 1.0) -> str | None:
    """Returns None when `address` accepts a TCP connection, else why not."""
    host, port = split_address(address)
    try:
        socket.getaddrinfo(host.strip("[]"), port)
    except socket.gaierror:
        return "name does not resolve"
    try:
        socket.create_connection((host.strip("[]"), port), timeout=timeout).close()
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


def unreachable(tasks: Sequence[Task]) -> list[str]:
    """`"worker 1 at host:port (reason)"` for every task that does not accept a connection now."""
    found = []
    for task in tasks:
        reason = probe(task.address)
        if reason is not None:
            found.append(f"{task.name} at {task.address} ({reason})")
    return found


def lost_peer_message(tf_config: Mapping[str, Any] | None, detail: str, what: str = "a peer") -> str:
    """One line naming the peers that no longer answer (probed now), with the first line of TensorFlow's error."""
    gone = unreachable(peers(tf_config)) if tf_config else []
    who = "; ".join(gone) if gone else "no peer is unreachable now"
    return f"lost contact with {what} during training ({who}): {detail.strip().splitlines()[0][:300]}"
