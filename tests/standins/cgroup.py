"""A real cgroup with a CPU quota, for tests that run a process under a CPU limit as a pod's container runs.

    with cpu_limited(1.0) as enter:
        subprocess.run(enter([sys.executable, "-m", "trainer.train", ...]))

Root only: the cgroup is created beside this process's own under the v2 hierarchy when its `cpu` controller can
be delegated, else under the v1 `cpu` hierarchy, and removed afterwards. The command joins it before it execs, so
the quota is the kernel's, enforced and read back exactly as in a container.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

PERIOD_US = 100_000


def _v2_parent() -> Path | None:
    root = Path("/sys/fs/cgroup")
    for candidate in (root, root / "unified"):
        controllers = candidate / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return candidate
    return None


def _v1_parent() -> Path | None:
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        candidate = Path("/sys/fs/cgroup") / name
        if (candidate / "cpu.cfs_quota_us").exists():
            return candidate
    return None


@contextlib.contextmanager
def cpu_limited(cpus: float) -> Iterator[Callable[[list[str]], list[str]]]:
    """A fresh cgroup whose CPU quota is `cpus`; yields a function that wraps a command to run inside it."""
    name = f"kfp-tf-test-{uuid.uuid4().hex[:8]}"
    quota = int(cpus * PERIOD_US)
    parent = _v2_parent()
    if parent is not None:
        subtree = parent / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            subtree.write_text("+cpu")
        group = parent / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        parent = _v1_parent()
        if parent is None:
            raise RuntimeError("no cgroup v2 cpu controller and no v1 cpu hierarchy under /sys/fs/cgroup")
        group = parent / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    procs = group / "cgroup.procs"

    def enter(command: list[str]) -> list[str]:
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *command]

    try:
        yield enter
    finally:
        for pid in procs.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        os.rmdir(group)
