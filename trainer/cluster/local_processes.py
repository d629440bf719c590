"""Tasks of a cluster as local processes: free loopback ports, one TF_CONFIG each, prefixed log lines.

A process killed whole is replaced (the local model of a lost pod). `trainer-launch` is the command line.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from trainer.cluster.control import ADDRESSES_ENV, SECRET_ENV, new_secret
from trainer.cluster.topology import assign_addresses, build_tf_config, task_count, tasks
from trainer.config.checks import Check, int_between, is_int, require
from trainer.core import cpus
from trainer.core.errors import UsageError
from trainer.core.processes import is_error_line, shell_code, signal_group

log = logging.getLogger(__name__)

MAX_LOCAL_WORKERS = 16
LOCAL_PS = f"0 (mirrored) or 1 to {MAX_LOCAL_WORKERS}"
GPU_ENV = "CUDA_VISIBLE_DEVICES"
NVIDIA_PROC = "/proc/driver/nvidia/gpus"


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free on `host` (an IPv4 or IPv6 address) a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def local_topology(
    workers: int, ps: int, chief: bool = False, evaluator: bool = False
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Loopback addresses for the TF servers and for the supervisors' control channels.

    Both are shaped alike (`assign_addresses`): `{"worker": [...]}`, with parameter servers (or when asked) a chief
    too (which may then be alone, without workers), and an evaluator when asked.
    """
    require("workers", workers, int_between(0 if chief else 1, MAX_LOCAL_WORKERS))
    require("ps", ps, Check(lambda v: is_int(v) and 0 <= v <= MAX_LOCAL_WORKERS, LOCAL_PS))
    total = task_count(workers, ps, chief, evaluator)
    if total > MAX_LOCAL_WORKERS:
        raise UsageError(
            f"chief + {ps} ps + {workers} workers is not allowed; allowed: 1 to {MAX_LOCAL_WORKERS} processes"
        )
    addresses = [f"localhost:{port}" for port in free_ports(2 * total)]
    return (
        assign_addresses(addresses[:total], workers, ps, chief, evaluator),
        assign_addresses(addresses[total:], workers, ps, chief, evaluator),
    )


def visible_gpus(
    env: dict[str, str] | None = None, smi: Sequence[str] = ("nvidia-smi", "-L"), proc: str = NVIDIA_PROC
) -> tuple[list[str], str]:
    """The GPUs this process may hand out, as CUDA_VISIBLE_DEVICES entries, and what says so.

    Its own CUDA_VISIBLE_DEVICES when set (CUDA's rule: the entries up to the first invalid one, such as -1), else one
    index per line of `nvidia-smi -L`, else one per entry of /proc/driver/nvidia/gpus, else none.
    """
    env = os.environ if env is None else env
    if GPU_ENV in env:
        found = []
        for entry in (part.strip() for part in env[GPU_ENV].split(",")):
            if not entry or entry.startswith("-"):
                break
            found.append(entry)
        return found, f"{GPU_ENV}={env[GPU_ENV]!r}"
    try:
        listed = subprocess.run(list(smi), capture_output=True, text=True, timeout=30, check=False)
        lines = [line for line in listed.stdout.splitlines() if line.startswith("GPU ")]
        if listed.returncode == 0 and lines:
            return [str(i) for i in range(len(lines))], "nvidia-smi -L"
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        entries = sorted(os.listdir(proc))
    except OSError:
        entries = []
    return [str(i) for i in range(len(entries))], proc if entries else "no nvidia-smi and no " + proc


def gpu_assignments(
    task_jobs: Sequence[str], per_worker: int, visible: Sequence[str], source: str = "this machine"
) -> list[str] | None:
    """Each task's CUDA_VISIBLE_DEVICES: `per_worker` GPUs of its own for every worker, none for the others.

    Args:
        task_jobs: each task's job (worker, chief, ps), in the launcher's order.
        per_worker: GPUs per worker; 0: None, every task keeps the launcher's environment.
        visible: the GPUs to hand out (`visible_gpus`).
        source: what says which GPUs are visible, for the error.

    Raises:
        UsageError: a negative count, or more GPUs than are visible.
    """
    require("gpus_per_worker", per_worker, Check(lambda v: is_int(v) and v >= 0, "0 or more"))
    if not per_worker:
        return None
    workers = sum(1 for job in task_jobs if job == "worker")
    if per_worker * workers > len(visible):
        raise UsageError(
            f"gpus_per_worker {per_worker} is not allowed: {workers} workers x {per_worker} GPUs is more than the "
            f"{len(visible)} GPUs this launcher can see ({source}); allowed: at most {len(visible) // max(workers, 1)}"
        )
    given = iter(visible)
    return [",".join(next(given) for _ in range(per_worker)) if job == "worker" else "" for job in task_jobs]


def _pump(label: str, stream: IO[bytes], last_error: dict[str, str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if is_error_line(line):
            last_error[label] = line
        sys.stdout.write(f"[{label}] {line}\n")
        sys.stdout.flush()


class WorkerGroup:
    """Starts and supervises one process per task of a cluster (`{"worker": [...]}` or chief + ps + workers).

    A task's process that dies whole, killed by a signal (SIGKILL, the OOM killer), is the local model of a lost
    pod: with `replacements` left it is started again with the same TF_CONFIG, as Kubernetes re-creates a pod, and
    its supervisor rejoins the survivors (`trainer.cluster.supervisor`). A process that exits with a code of its own has
    decided for good. With `gpus` (`gpu_assignments`) each task's CUDA_VISIBLE_DEVICES is its entry. With control
    addresses every process gets them (`TRAINER_CONTROL`) and one secret of this group,
    generated here (`TRAINER_CONTROL_SECRET`), which its supervisor keeps from the training process.
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
        pin: bool = True,
        gpus: Sequence[str] | None = None,
    ) -> None:
        self.command = list(command)
        self.cluster = cluster
        self.control = control
        self.secret = new_secret() if control else ""
        self.tasks = [(task.job, task.index) for task in tasks(cluster)]
        self.labels = [task.name for task in tasks(cluster)]
        self.tolerate = set(tolerate)
        self.grace = grace
        self.env = dict(os.environ if env is None else env)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.last_error: dict[str, str] = {}
        self.tolerated: dict[str, int] = {}
        self.replaced: dict[str, int] = {}
        self.replacements = replacements
        self.gpus = list(gpus) if gpus is not None else None
        self._pumps: list[threading.Thread] = []
        budget = cpus.cpu_budget()
        self.shares = cpus.shares(len(self.tasks), pin, budget)
        if len(self.tasks) > budget.cpus:
            log.warning("%d processes on %s: one thread each, sharing the CPUs", len(self.tasks), budget.describe())

    def start(self) -> None:
        """Starts one process per task, each with its TF_CONFIG."""
        for position in range(len(self.tasks)):
            self.procs.append(self._spawn(position))

    def _spawn(self, position: int) -> subprocess.Popen[bytes]:
        job, index = self.tasks[position]
        share = self.shares[position]
        env = dict(self.env)
        env["TF_CONFIG"] = json.dumps(build_tf_config(self.cluster, job, index))
        if self.control:
            env[ADDRESSES_ENV] = json.dumps(self.control)
            env[SECRET_ENV] = self.secret
        env.setdefault(cpus.INTRA_ENV, str(share.threads))
        env.setdefault(cpus.INTER_ENV, str(cpus.INTER_OP_THREADS))
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        if self.gpus is not None:
            env[GPU_ENV] = self.gpus[position]
            # nvidia-smi numbers the GPUs in PCI bus order; CUDA, unless told, fastest first.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            where_gpus = f", {GPU_ENV}={self.gpus[position]!r}"
        else:
            where_gpus = ""
        env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        where = ""
        if share.cpus is not None:
            # Before the new interpreter starts a thread: every thread it and its children start inherits the mask.
            os.sched_setaffinity(proc.pid, share.cpus)
            where = f" on CPUs {cpus.ranges(share.cpus)}"
        pump = threading.Thread(target=_pump, args=(self.labels[position], proc.stdout, self.last_error), daemon=True)
        pump.start()
        self._pumps.append(pump)
        log.info(
            "started %s (pid %d)%s, %s=%s%s",
            self.labels[position],
            proc.pid,
            where,
            cpus.INTRA_ENV,
            env[cpus.INTRA_ENV],
            where_gpus,
        )
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
                    self.tolerated[label] = shell_code(code)
                    log.warning("%s exited with code %d; the others carry on", label, shell_code(code))
                    continue
                self.stop()
                return shell_code(code), label
            if all(c is not None for c in codes):
                self._drain()
                return 0, None
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM every live task, SIGKILL those still there after the grace period."""
        live = [p for p in self.procs if p.poll() is None]
        for p in live:
            signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(p, signal.SIGKILL)
                p.wait()
        self._drain()

    def _drain(self) -> None:
        for pump in self._pumps:
            pump.join(timeout=5)
