"""Local launcher: N training workers on loopback, like torchrun for TensorFlow.

    trainer-launch --workers 2 -- --data /tmp/mnist --model-dir /tmp/model --epochs 5

Picks free loopback ports, builds one TF_CONFIG per worker with `trainer.cluster.build_tf_config`, starts one
`trainer-train` per task (each supervises its own training process: start-up watchdog, prompt cancel, and with
`--max-restarts N` restarts in place that all workers converge on), prefixes every log line with the task's name,
and if any task fails for good stops the others (SIGTERM, then SIGKILL after a grace period) and exits with that
task's code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from trainer.cli import setup_logging
from trainer.cluster import assign_addresses, build_tf_config
from trainer.errors import EXIT_BAD_INPUT, UsageError
from trainer.flags import Parser
from trainer.train import CONTROL_ENV

log = logging.getLogger(__name__)

MAX_LOCAL_WORKERS = 16
_UNCAUGHT = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free on `host` a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_cluster(workers: int) -> list[str]:
    """`workers` loopback addresses on free ports."""
    if not 1 <= workers <= MAX_LOCAL_WORKERS:
        raise UsageError(f"workers {workers} is not allowed; allowed: 1 to {MAX_LOCAL_WORKERS}")
    return [f"localhost:{port}" for port in free_ports(workers)]


def local_topology(workers: int, ps: int) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Loopback addresses for the TF servers and for the supervisors' control channels.

    Both are shaped alike: `{"worker": [...]}`, or with parameter servers `{"chief", "worker", "ps"}`.
    """
    if ps and not 1 <= ps <= MAX_LOCAL_WORKERS:
        raise UsageError(f"ps {ps} is not allowed; allowed: 0 (mirrored) or 1 to {MAX_LOCAL_WORKERS}")
    total = workers + ps + 1 if ps else workers
    if not 1 <= workers <= MAX_LOCAL_WORKERS or total > MAX_LOCAL_WORKERS:
        what = f"chief + {ps} ps + {workers} workers" if ps else f"workers {workers}"
        raise UsageError(f"{what} is not allowed; allowed: 1 to {MAX_LOCAL_WORKERS} processes")
    addresses = [f"localhost:{port}" for port in free_ports(2 * total)]
    return assign_addresses(addresses[:total], workers, ps), assign_addresses(addresses[total:], workers, ps)


def _pump(label: str, stream: IO[bytes], last_error: dict[str, str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if line.startswith("error:") or _UNCAUGHT.match(line):
            last_error[label] = line
        sys.stdout.write(f"[{label}] {line}\n")
        sys.stdout.flush()


class WorkerGroup:
    """Starts and supervises one process per task of a cluster (`{"worker": [...]}` or chief + ps + workers).

    A task's process that dies whole, killed by a signal (SIGKILL, the OOM killer), is the local model of a lost
    pod: with `replacements` left it is started again with the same TF_CONFIG, as Kubernetes re-creates a pod, and
    its supervisor rejoins the survivors (`trainer.supervisor`). A process that exits with a code of its own has
    decided for good.
    """

    def __init__(
        self,
        command: Sequence[str],
        cluster: dict[str, list[str]],
        grace: float,
        tolerate: Sequence[str] = (),
        env: dict[str, str] | None = None,
        control: dict[str, list[str]] | None = None,
        replacements: int = 0,
    ) -> None:
        self.command = list(command)
        self.cluster = cluster
        self.control = control
        self.tasks = [(job, index) for job, addresses in cluster.items() for index in range(len(addresses))]
        self.labels = [f"{job} {index}" for job, index in self.tasks]
        self.tolerate = set(tolerate)
        self.grace = grace
        self.env = dict(os.environ if env is None else env)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.last_error: dict[str, str] = {}
        self.tolerated: dict[str, int] = {}
        self.replaced: dict[str, int] = {}
        self.replacements = replacements
        self._pumps: list[threading.Thread] = []

    def start(self) -> None:
        """Starts one process per task, each with its TF_CONFIG."""
        for position in range(len(self.tasks)):
            self.procs.append(self._spawn(position))

    def _spawn(self, position: int) -> subprocess.Popen[bytes]:
        job, index = self.tasks[position]
        threads = max(1, (os.cpu_count() or 1) // len(self.tasks))
        env = dict(self.env)
        env["TF_CONFIG"] = json.dumps(build_tf_config(self.cluster, job, index))
        if self.control:
            env[CONTROL_ENV] = json.dumps(self.control)
        env.setdefault("TF_NUM_INTRAOP_THREADS", str(threads))
        env.setdefault("TF_NUM_INTEROP_THREADS", "2")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        pump = threading.Thread(target=_pump, args=(self.labels[position], proc.stdout, self.last_error), daemon=True)
        pump.start()
        self._pumps.append(pump)
        log.info("started %s (pid %d)", self.labels[position], proc.pid)
        return proc

    def _replace(self, position: int, code: int) -> bool:
        """Starts a new process for a task whose process was killed by signal `-code`, if replacements are left."""
        label = self.labels[position]
        used = self.replaced.get(label, 0)
        if code >= 0 or used >= self.replacements:
            return False
        self.replaced[label] = used + 1
        log.warning(
            "%s was killed by signal %d (its whole process, as when a pod is lost); starting a replacement (%d of %d)",
            label,
            -code,
            used + 1,
            self.replacements,
        )
        self.procs[position] = self._spawn(position)
        return True

    def wait(self) -> tuple[int, str | None]:
        """Waits until every task has exited or one whose failure is not tolerated fails.

        Returns (exit code, label of the failed task or None); tolerated failures are kept in `self.tolerated`.
        """
        while True:
            codes = [p.poll() for p in self.procs]
            for position, ((job, _), label, code) in enumerate(zip(self.tasks, self.labels, codes, strict=True)):
                if code in (None, 0) or label in self.tolerated:
                    continue
                if self._replace(position, code):
                    codes[position] = None
                    continue
                if job in self.tolerate:
                    self.tolerated[label] = _shell_code(code)
                    log.warning("%s exited with code %d; the others carry on", label, _shell_code(code))
                    continue
                self.stop()
                return _shell_code(code), label
            if all(c is not None for c in codes):
                self._drain()
                return 0, None
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every live task, SIGKILL those still there after the grace period."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        self._drain()

    def _drain(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=5)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _shell_code(code: int) -> int:
    """Exit status as a shell reports it: a process killed by signal N is 128 + N."""
    return 128 - code if code < 0 else code


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-launch (its own flags; the trainer's come after `--`)."""
    p = Parser(
        prog="trainer-launch",
        description="Run N trainer workers on this machine with a generated TF_CONFIG each.",
        usage="trainer-launch --workers N [--ps P] [--max-restarts R] [--grace S] -- TRAINING_ARGS...",
    )
    p.add_argument("--workers", type=int, required=True, help=f"number of worker processes (1 to {MAX_LOCAL_WORKERS})")
    p.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping workers"
    )
    p.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter servers; with N > 0 runs chief + N ps + --workers workers under ParameterServerStrategy",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="each worker restarts its training process in place up to N times after a retryable failure "
        "(a lost peer, a killed training process), and a worker whose whole process is killed is replaced up to N "
        "times, as a lost pod is; all workers restart together and resume after the last finished epoch",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """trainer-launch: runs N local workers and supervises them; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    setup_logging("launch ")
    try:
        args = build_parser().parse_args(own)
        if args.max_restarts < 0:
            raise UsageError(f"max restarts {args.max_restarts} is not allowed; allowed: 0 or more")
        if not 0 <= args.grace <= 3600:
            raise UsageError(f"grace {args.grace!r} is not allowed; allowed: 0 to 3600 seconds")
        if args.ps < 0:
            raise UsageError(f"ps {args.ps} is not allowed; allowed: 0 (mirrored) or 1 to {MAX_LOCAL_WORKERS}")
        cluster, control = local_topology(args.workers, args.ps)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.ps and "--strategy" not in rest:
        rest = [*rest, "--strategy", "parameter_server"]
    if args.max_restarts:
        rest = [*rest, "--max-restarts", str(args.max_restarts)]
    group = WorkerGroup(
        [sys.executable, "-m", "trainer.train", *rest],
        cluster,
        args.grace,
        tolerate=("worker",) if args.ps else (),
        control=control,
        replacements=args.max_restarts,
    )

    def interrupted(signum: int, frame: object) -> None:
        group.stop()
        sys.exit(128 + signum)

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("starting %s", json.dumps(cluster))
        group.start()
        code, label = group.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if label is not None:
        print(
            f"error: {label} failed with exit code {code}: {group.last_error.get(label, 'no error line')}",
            file=sys.stderr,
        )
        return code
    log.info("all %d processes finished", len(group.tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
