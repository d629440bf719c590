"""Naming the peers of a cluster that cannot be reached: what a start-up timeout or a lost peer reports."""

from __future__ import annotations

import socket
import time
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


# How long a lost contact's report waits for the peer that broke it to stop answering: a process killed with
# SIGKILL (a lost pod's) closes its sockets one after another, and may be descheduled between them, so its first
# reset connection can arrive while its server still accepts.
SETTLE_SECONDS = 3.0


def lost_peer_message(
    tf_config: Mapping[str, Any] | None, detail: str, what: str = "a peer", settle: float = SETTLE_SECONDS
) -> str:
    """One line naming the peers that no longer answer, with the first line of TensorFlow's error.

    The peers are probed now and, while every one still answers, again every 0.1 s for up to `settle` seconds.
    """
    tasks = peers(tf_config) if tf_config else []
    gone = unreachable(tasks)
    deadline = time.monotonic() + settle
    while tasks and not gone and time.monotonic() < deadline:
        time.sleep(0.1)
        gone = unreachable(tasks)
    who = "; ".join(gone) if gone else "no peer is unreachable now"
    return f"lost contact with {what} during training ({who}): {detail.strip().splitlines()[0][:300]}"
