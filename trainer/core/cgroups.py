"""This process's cgroups, as the kubelet sets a pod's limits on them: the smallest limit on the way to the root.

A limit may sit on the container's cgroup or on any ancestor (the pod's, a QoS class's), so every directory from
the process's own cgroup up to the hierarchy's mount point is read; the smallest limit found wins. The unified (v2)
hierarchy is preferred; a v1 hierarchy counts when it carries the controller asked for. `trainer.core.cpus` (the
CPU quota) and `trainer.core.memory` (the memory limit) read their files through here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T", int, float)


def read(path: Path) -> str | None:
    """A cgroup file's content, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _mounts(proc: Path, controller: str) -> list[tuple[int, str, str]]:
    """(version, root, mount point) of the v2 mount and of the v1 mounts carrying `controller`, from mountinfo."""
    found = []
    for line in (read(proc / "self" / "mountinfo") or "").splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        fstype = after[0] if after else ""
        options = after[2].split(",") if len(after) > 2 else []
        root, point = fields[3], fields[4].replace("\\040", " ")
        if fstype == "cgroup2":
            found.append((2, root, point))
        elif fstype == "cgroup" and controller in options:
            found.append((1, root, point))
    return found


def _own(proc: Path, controller: str) -> dict[int, str]:
    """This process's cgroup path in the v2 hierarchy (key 2) and in the v1 hierarchy holding `controller` (key 1)."""
    paths: dict[int, str] = {}
    for line in (read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif controller in controllers.split(","):
            paths[1] = path
    return paths


def smallest(
    proc: Path, controller: str, limit: Callable[[Path, int], T | None], names: tuple[str, str]
) -> tuple[T, str] | None:
    """The smallest limit on this process's cgroup and its ancestors, and where it was found.

    Args:
        proc: where procfs is mounted.
        controller: the v1 controller that carries the limit (`cpu`, `memory`).
        limit: reads the limit set on one cgroup directory of a hierarchy of that version; None when it sets none.
        names: the limit's file name in v1 and in v2, for the description (`cgroup v2 memory.max of DIR`).
    """
    own = _own(proc, controller)
    for version, root, point in sorted(_mounts(proc, controller), key=lambda m: -m[0]):
        path = own.get(version)
        if path is None:
            continue
        relative = os.path.relpath(path, root) if path.startswith(root) else None
        if relative is None or relative.startswith(".."):
            relative = "."
        directory = Path(point) / relative
        best: tuple[T, str] | None = None
        while True:
            found = limit(directory, version)
            if found is not None and (best is None or found < best[0]):
                best = (found, f"cgroup v{version} {names[version - 1]} of {directory}")
            if directory == Path(point) or directory.parent == directory:
                break
            directory = directory.parent
        if best:
            return best
    return None
