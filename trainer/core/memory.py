"""The memory this process may use, and where a worker keeps its share of the data (memory, local disk or nowhere).

`memory_limit()` reads the limit the way the kernel enforces it, as `trainer.core.cpus` reads the CPU quota:

1. `TRAINER_MEMORY_LIMIT` (bytes or a Kubernetes quantity such as `512Mi`): for tests, and for a limit the cgroup
   does not show;
2. the smallest memory limit of this process's cgroup and of its ancestors up to the mount's root: `memory.max`
   under cgroup v2, `memory.limit_in_bytes` under v1 (a pod's `resources.limits.memory` lands there);
3. else the machine's memory.

`room` also reads how much of the local disk a file cache may take: the free space of the temporary directory, at most
`TRAINER_DISK_LIMIT` (bytes or a quantity) when set: a pod's `ephemeral-storage` limit, which the kubelet enforces by
evicting the pod but the file system's free space does not show.

`choose_cache` is the one decision both input pipelines (your function's saved splits and the TFRecord shards) take
for a worker's share: in memory when it fits `MEMORY_FRACTION` of the limit (the rest is the model, its optimizer
state, TensorFlow and the shuffle buffer), else in a `tf.data` file cache on local disk when it fits `DISK_FRACTION`
of the free space there, else streamed from the dataset every epoch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from trainer.core import cgroups

MEMORY_FRACTION = 0.25
DISK_FRACTION = 0.5
LIMIT_ENV = "TRAINER_MEMORY_LIMIT"
DISK_LIMIT_ENV = "TRAINER_DISK_LIMIT"
# cgroup v1 writes "no limit" as the largest page-aligned 63-bit number (9223372036854771712).
_UNLIMITED = 1 << 62


@dataclasses.dataclass(frozen=True)
class MemoryLimit:
    """How many bytes of memory this process may use and what says so."""

    bytes: int
    source: str

    def describe(self) -> str:
        """For a log line: `8.0 GiB (cgroup v2 memory.max of /sys/fs/cgroup/kubepods/pod1)`."""
        return f"{size(self.bytes)} ({self.source})"


@dataclasses.dataclass(frozen=True)
class Room:
    """Where a worker may keep its share: the memory limit; the local directory for a file cache, its free space."""

    memory: MemoryLimit
    disk_dir: str
    disk_free: int
    disk_source: str = ""

    def disk(self) -> str:
        """For a log line: `the 40.0 GiB free in /tmp` (with what limits it, when something does)."""
        return f"the {size(self.disk_free)} free in {self.disk_dir}{self.disk_source}"


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """Where a share is kept: `memory`, `disk` (a tf.data file cache) or `stream` (read again every epoch), and why."""

    where: str
    share_bytes: int
    reason: str

    def describe(self, what: str, limit: MemoryLimit) -> str:
        """The one log line: the share's bytes, the limit, the choice and its reason."""
        return f"{what}: {size(self.share_bytes)}; memory limit {limit.describe()}; {self.where}: {self.reason}"


def size(n: float) -> str:
    """Bytes for people: `512 B`, `1.5 MiB`, `8.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def choose_cache(share_bytes: int, room: Room, in_memory_already: int = 0) -> CacheChoice:
    """Where to keep a share of `share_bytes` (a pure function of the numbers).

    Args:
        share_bytes: the share's size as the input pipeline holds it (decoded tensors).
        room: the memory limit and the local disk's free space.
        in_memory_already: bytes this process already keeps in memory under the same budget (the training share,
            when deciding for the test share).
    """
    budget = int(room.memory.bytes * MEMORY_FRACTION) - in_memory_already
    if share_bytes <= budget:
        return CacheChoice(
            "memory", share_bytes, f"it fits {MEMORY_FRACTION:g} of the limit ({size(budget)} left of it)"
        )
    over = f"more than {MEMORY_FRACTION:g} of the limit ({size(max(budget, 0))} left of it)"
    disk_room = int(room.disk_free * DISK_FRACTION)
    if room.disk_free and share_bytes <= disk_room:
        return CacheChoice(
            "disk",
            share_bytes,
            f"{over}; it fits {DISK_FRACTION:g} of {room.disk()}",
        )
    disk = f"{DISK_FRACTION:g} of {room.disk()}" if room.disk_free else "no disk"
    return CacheChoice("stream", share_bytes, f"{over} and of {disk}: read from the dataset every epoch")


def room(
    disk_dir: str | None = None, proc: str | os.PathLike[str] = "/proc", env: Mapping[str, str] | None = None
) -> Room:
    """This process's memory limit and the free space of `disk_dir` (default: the temporary directory).

    Raises:
        UsageError: `TRAINER_MEMORY_LIMIT` or `TRAINER_DISK_LIMIT` is set but is not a quantity of at least 1 byte.
    """
    env = os.environ if env is None else env
    directory = disk_dir or tempfile.gettempdir()
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = 0
    source = ""
    cap = _quantity(env, DISK_LIMIT_ENV)
    if cap is not None:
        free, source = min(free, cap), f" (at most {DISK_LIMIT_ENV})"
    return Room(memory_limit(proc, env), directory, free, source)


def _quantity(env: Mapping[str, str], name: str) -> int | None:
    """The bytes `env[name]` says (bytes or a Kubernetes quantity such as `512Mi`); None when it is unset or blank.

    Raises:
        UsageError: it is not a quantity of at least 1 byte.
    """
    if not env.get(name, "").strip():
        return None
    from trainer.core.quantity import parse

    amount = int(parse(env[name], name))
    if amount < 1:
        from trainer.core.errors import UsageError

        raise UsageError(f"{name} {env[name]!r} is not allowed; allowed: at least 1 byte")
    return amount


def memory_limit(proc: str | os.PathLike[str] = "/proc", env: Mapping[str, str] | None = None) -> MemoryLimit:
    """The memory this process may use (see the module docstring).

    Raises:
        UsageError: `TRAINER_MEMORY_LIMIT` is set but is not a quantity of at least 1 byte.
    """
    env = os.environ if env is None else env
    amount = _quantity(env, LIMIT_ENV)
    if amount is not None:
        return MemoryLimit(amount, LIMIT_ENV)
    found = _cgroup_limit(Path(proc))
    if found:
        return MemoryLimit(*found)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = 0
    return MemoryLimit(total, "the machine's memory: no cgroup limit")


def _limit(directory: Path, version: int) -> int | None:
    """The memory limit set on one cgroup directory in bytes; None when it sets none."""
    text = cgroups.read(directory / ("memory.max" if version == 2 else "memory.limit_in_bytes"))
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if 0 < value < _UNLIMITED else None


def _cgroup_limit(proc: Path) -> tuple[int, str] | None:
    """The smallest memory limit on this process's cgroup and its ancestors, with where it was found."""
    return cgroups.smallest(proc, "memory", _limit, ("memory.limit_in_bytes", "memory.max"))
