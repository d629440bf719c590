"""The CPU this process may use: its cgroup's CPU quota (v2 or v1), else its affinity, else the machine's cores.

TensorFlow sizes its thread pools from the cores a process may be scheduled on, not from its CPU limit. In a pod
with a 2-CPU limit on a 32-core node (no static CPU manager) that is 32 intra-op threads sharing 2 CPUs' worth of
quota: most of the time goes to throttling and switching threads. `cpu_budget()` reads the limit the way the
kernel enforces it, like Go's automaxprocs and the JVM's container support:

1. the CPU quota of this process's cgroup and of its ancestors up to the mount's root (the smallest wins):
   `cpu.max` under cgroup v2, `cpu.cfs_quota_us` / `cpu.cfs_period_us` under v1, found through
   `/proc/self/cgroup` and `/proc/self/mountinfo` (a container sees its own cgroup at the mount's root);
2. else the CPUs in this process's affinity mask (a cpuset, `taskset`, the kubelet's static CPU manager);
3. else the machine's cores.

A quota is never more than the affinity allows. `threads` is the budget rounded down, at least 1.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path

from trainer.core import cgroups


@dataclasses.dataclass(frozen=True)
class CpuBudget:
    """How much CPU this process may use and what says so."""

    cpus: float
    source: str

    @property
    def threads(self) -> int:
        """Compute threads that fit the budget: the CPUs rounded down, at least 1."""
        return max(1, math.floor(self.cpus + 1e-9))

    def describe(self) -> str:
        """For a log line: `1.5 CPUs (cgroup v2 cpu.max of /kubepods/pod1/c1)`."""
        return f"{self.cpus:g} CPU{'' if self.cpus == 1 else 's'} ({self.source})"


def _quota(directory: Path, version: int) -> float | None:
    """The CPU quota set on one cgroup directory, in CPUs; None when it sets none."""
    if version == 2:
        text = cgroups.read(directory / "cpu.max")
        if not text:
            return None
        quota, _, period = text.partition(" ")
        if quota == "max":
            return None
        try:
            return int(quota) / int(period or 100_000)
        except ValueError:
            return None
    quota_text = cgroups.read(directory / "cpu.cfs_quota_us")
    period_text = cgroups.read(directory / "cpu.cfs_period_us")
    try:
        quota, period = int(quota_text or -1), int(period_text or 0)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _cgroup_quota(proc: Path) -> tuple[float, str] | None:
    """The smallest CPU quota on this process's cgroup and its ancestors, with where it was found."""
    return cgroups.smallest(proc, "cpu", _quota, ("cpu.cfs_quota_us", "cpu.max"))


def cpu_budget(proc: str | os.PathLike[str] = "/proc", affinity: set[int] | None = None) -> CpuBudget:
    """The CPU this process may use (see the module docstring).

    Args:
        proc: where procfs is mounted (its `self/cgroup` and `self/mountinfo` are read).
        affinity: the CPUs this process may run on; default: its affinity mask.
    """
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    cores = len(affinity) or os.cpu_count() or 1
    where = "affinity" if affinity else "cores"
    quota = _cgroup_quota(Path(proc))
    if quota and quota[0] < cores:
        return CpuBudget(round(quota[0], 3), quota[1])
    if affinity:
        return CpuBudget(float(cores), f"{where}: CPUs {ranges(affinity)}")
    return CpuBudget(float(cores), where)


def ranges(cpus: set[int]) -> str:
    """`{0, 1, 2, 5}` -> `0-2,5`."""
    ordered = sorted(cpus)
    spans: list[str] = []
    start = prev = ordered[0]
    for cpu in ordered[1:] + [None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(spans)


def split(cpus: set[int], parts: int) -> list[set[int]] | None:
    """`cpus` divided into `parts` disjoint sets of equal size (the remainder unused); None when too few CPUs."""
    ordered = sorted(cpus)
    size = len(ordered) // parts if parts else 0
    if size < 1:
        return None
    return [set(ordered[i * size : (i + 1) * size]) for i in range(parts)]


INTRA_ENV = "TF_NUM_INTRAOP_THREADS"
INTER_ENV = "TF_NUM_INTEROP_THREADS"
# Never fewer: with one inter-op thread, ops that wait on other ops deadlock (ParameterServerStrategy's
# coordinator hangs at its first step, measured here). Idle inter-op threads sleep; they cost no CPU.
INTER_OP_THREADS = 2


@dataclasses.dataclass(frozen=True)
class ThreadCounts:
    """TensorFlow's intra-op and inter-op thread pool sizes for one process, and why."""

    intra: int
    inter: int
    reason: str


def _env_count(env: Mapping[str, str], name: str) -> int:
    try:
        value = int(env.get(name, "0"))
    except ValueError:
        return 0
    return value if value > 0 else 0


def thread_counts(
    requested: int = 0, env: Mapping[str, str] | None = None, budget: CpuBudget | None = None
) -> ThreadCounts:
    """The thread pools that fit this process.

    Intra-op: `requested` (the `threads` setting), else TensorFlow's own TF_NUM_INTRAOP_THREADS (a launcher's
    share), else the CPU budget. Inter-op: TF_NUM_INTEROP_THREADS, else `INTER_OP_THREADS`.
    """
    env = os.environ if env is None else env
    if requested:
        intra, reason = requested, "the threads setting"
    elif _env_count(env, INTRA_ENV):
        intra, reason = _env_count(env, INTRA_ENV), f"{INTRA_ENV}"
    else:
        budget = budget or cpu_budget()
        intra, reason = budget.threads, budget.describe()
    return ThreadCounts(intra, _env_count(env, INTER_ENV) or INTER_OP_THREADS, reason)


@dataclasses.dataclass(frozen=True)
class Share:
    """What a launcher gives each of its tasks: CPUs to pin it to (None: not pinned) and its thread count."""

    cpus: set[int] | None
    threads: int


def shares(
    tasks: int, pin: bool = True, budget: CpuBudget | None = None, affinity: set[int] | None = None
) -> list[Share]:
    """Divides this process's CPU among `tasks` processes without oversubscribing where the CPUs allow it.

    With `pin` and at least one CPU of the affinity per task, and no quota below the affinity, each task gets its
    own CPUs (as the kubelet's static CPU manager gives a pod) and one thread per CPU. Otherwise each gets
    `floor(budget / tasks)` threads (at least 1: more tasks than CPUs share them).
    """
    if affinity is None:
        affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    budget = budget or cpu_budget(affinity=affinity)
    sets = split(affinity, tasks) if pin and affinity and budget.cpus >= len(affinity) else None
    if sets:
        return [Share(cpus, len(cpus)) for cpus in sets]
    return [Share(None, max(1, math.floor(budget.cpus / tasks + 1e-9))) for _ in range(tasks)]


# Host threads a GPU keeps busy launching its kernels and copying its batches (TensorFlow's GPU runtime; two is
# TF_GPU_THREAD_COUNT's default in its gpu_private mode).
GPU_HOST_THREADS = 2


def input_threads(threads: int, gpus: int) -> int:
    """The size of tf.data's thread pool on a worker with `threads` CPU threads and `gpus` GPUs.

    On CPU the model and the input pipeline share the threads (all of them). With GPUs the model runs on the GPUs and
    the CPUs feed them: every thread but `GPU_HOST_THREADS` per GPU reads and decodes batches (at least one).
    """
    return threads if not gpus else max(1, threads - GPU_HOST_THREADS * gpus)
