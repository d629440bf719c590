"""A start-up watchdog that lives in its own process.

MultiWorkerMirroredStrategy blocks inside its constructor until every peer has connected, holding the GIL and
ignoring SIGTERM, so neither a Python thread nor a signal handler in the worker can end the wait. This module runs
as a small child process (stdlib only, no TensorFlow): if the worker does not disarm it within the timeout, it
probes every peer, logs one line naming those that cannot be reached, and SIGKILLs the worker (exit 137, which
Kubernetes and TFJob's ExitCode policy treat as retryable).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.cluster import own_address, split_address


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


def describe_peers(tf_config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`(task name, address)` for every task but this one, e.g. `("worker 1", "localhost:2223")`."""
    own = own_address(tf_config)
    return [
        (f"{job} {index}", address)
        for job, addresses in tf_config["cluster"].items()
        for index, address in enumerate(addresses)
        if address != own
    ]


def unreachable(peers: Sequence[tuple[str, str]]) -> list[str]:
    found = []
    for name, address in peers:
        reason = probe(address)
        if reason is not None:
            found.append(f"{name} at {address} ({reason})")
    return found


class StartupWatchdog:
    """Context manager: SIGKILLs this process if the block has not finished within `timeout` seconds."""

    def __init__(self, tf_config: Mapping[str, Any], timeout: float, what: str = "cluster start-up") -> None:
        self._args = [sys.executable, "-m", "trainer.watchdog", "--pid", str(os.getpid()), "--timeout", str(timeout),
                      "--what", what, "--tf-config", json.dumps(dict(tf_config))]
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StartupWatchdog:
        self._proc = subprocess.Popen(self._args, stdin=subprocess.PIPE)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(b"disarm\n")
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        self._proc.wait()


def watch(pid: int, timeout: float, tf_config: Mapping[str, Any], what: str) -> int:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if ready:
            sys.stdin.readline()
            return 0
    peers = describe_peers(tf_config)
    missing = unreachable(peers)
    task = tf_config["task"]
    if missing:
        detail = "unreachable: " + "; ".join(missing)
    else:
        detail = "every peer accepts connections but the cluster did not form (" + ", ".join(a for _, a in peers) + ")"
    print(f"error: {task['type']} {task['index']}: {what} did not finish within {timeout:g}s; {detail}", file=sys.stderr, flush=True)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description="internal: start-up watchdog for a training worker")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--what", default="cluster start-up")
    parser.add_argument("--tf-config", required=True)
    args = parser.parse_args()
    return watch(args.pid, args.timeout, json.loads(args.tf_config), args.what)


if __name__ == "__main__":
    sys.exit(main())
