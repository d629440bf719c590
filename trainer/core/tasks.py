"""One task of a cluster by its type and index, and the three ways it is written.

    TaskId("worker", 1).name       worker 1     log lines, errors, the launcher's `[worker 1]` prefixes
    TaskId("worker", 1).directory  worker-1     a task's own directory (checkpoint homes, a local job's task dirs)
    TaskId("worker", 1).label      worker:1     what crosses steps: a server step's `task`, the task records

`TaskId.parse` reads a label back. Kubernetes object names are not task ids: a run's Services are named by their
position in the run (`tfw-<run key>-<N>`, `trainer.k8s.objects`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from trainer.core.errors import UsageError

_LABEL = re.compile(r"([a-z]+):(0|[1-9][0-9]*)")


class TaskId(NamedTuple):
    """A task of a cluster: its type (TF_CONFIG's job name: `chief`, `worker`, `ps`, `evaluator`) and index."""

    type: str
    index: int

    @property
    def name(self) -> str:
        """`worker 1`: the task as log lines and errors name it."""
        return f"{self.type} {self.index}"

    @property
    def directory(self) -> str:
        """`worker-1`: the name of the task's own directory."""
        return f"{self.type}-{self.index}"

    @property
    def label(self) -> str:
        """`worker:1`: the task as it crosses steps and records; `parse` reads it back."""
        return f"{self.type}:{self.index}"

    @classmethod
    def parse(cls, label: str) -> TaskId:
        """The task a label names.

        Raises:
            UsageError: `label` is not `TYPE:INDEX` (a lowercase type, a non-negative index without leading zeros).
        """
        match = _LABEL.fullmatch(label) if isinstance(label, str) else None
        if not match:
            raise UsageError(f"task {label!r} is not TYPE:INDEX; allowed: a task such as 'worker:1' or 'ps:0'")
        return cls(match.group(1), int(match.group(2)))

    @classmethod
    def of(cls, tf_config: Mapping[str, Any] | None) -> TaskId:
        """The task a TF_CONFIG (as a dict) is for; worker 0 for a process without one."""
        if not tf_config:
            return cls("worker", 0)
        task = tf_config["task"]
        return cls(task["type"], int(task["index"]))
