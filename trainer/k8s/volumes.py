"""Whether a path in a pod is on a mounted volume or on the container's own disk (gone with the pod)."""

from __future__ import annotations

import os

MOUNTINFO = "/proc/self/mountinfo"


def mount_point(path: str, mountinfo: str) -> str:
    """The mount point `path` lies under, from the text of /proc/self/mountinfo (field 5, octal escapes undone)."""
    path = os.path.normpath(os.path.abspath(path))
    best = "/"
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best = point
    return best


def on_own_disk(path: str, mountinfo: str | None = None) -> bool:
    """Whether `path` is on the container's root filesystem: nothing is mounted at it or above it but `/`."""
    if mountinfo is None:
        with open(MOUNTINFO) as f:
            mountinfo = f.read()
    return mount_point(path, mountinfo) == "/"
