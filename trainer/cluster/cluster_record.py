"""cluster.json: the run's cluster as the create-cluster step writes it and every training task reads it.

It also carries the run's control secret (`trainer.cluster.control`): the file is an artifact of the run in the
pipeline root, so whoever can read the run's artifacts can read it, as every task of the run does; the step's
artifact metadata (shown in the KFP UI and kept in ML Metadata) leaves it out. On a path it is created readable by
its owner only (mode 0600) before its first byte is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from trainer.cluster.control import check_secret, new_secret
from trainer.cluster.topology import validate_cluster
from trainer.core.errors import UsageError
from trainer.core.files import check_writable_parent, json_bytes, read_json, write_bytes, write_json
from trainer.core.tasks import TaskId


@dataclasses.dataclass(frozen=True)
class ClusterRecord:
    """Every task's TF address, its supervisor's control address (shaped alike), and how they were given.

    Attributes:
        cluster: the cluster spec every task turns into its TF_CONFIG (`{"worker": [...]}`, or chief, worker, ps).
        control: the supervisors' control addresses, shaped like `cluster` (empty: none, the tasks do not restart
            together).
        mode: `kubernetes` (one Service name per task) or `local` (free loopback ports).
        secret: the run's control secret, which every request on the supervisors' control channel proves (empty:
            the record has no control addresses).
    """

    cluster: dict[str, list[str]]
    control: dict[str, list[str]]
    mode: str
    secret: str = dataclasses.field(default="", repr=False)

    FILE: ClassVar[str] = "cluster.json"

    @classmethod
    def new(cls, cluster: dict[str, list[str]], control: dict[str, list[str]], mode: str) -> ClusterRecord:
        """A record for a new run: with control addresses, a fresh control secret."""
        return cls(cluster, control, mode, new_secret() if control else "")

    def to_json(self) -> dict[str, Any]:
        """The record without its secret: the step's artifact metadata."""
        return {"cluster": self.cluster, "control": self.control, "mode": self.mode}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = FILE) -> ClusterRecord:
        """The record from cluster.json's content, checked.

        Raises:
            UsageError: naming `where` and what is wrong.
        """
        if not isinstance(data, Mapping):
            raise UsageError(f"cluster file {where!r} does not hold an object")
        cluster = validate_cluster(data.get("cluster") or {})
        control = validate_cluster(data.get("control") or {})
        if {job: len(a) for job, a in control.items()} != {job: len(a) for job, a in cluster.items()}:
            raise UsageError(f"cluster file {where!r}: its control addresses are not shaped like its cluster")
        if data.get("mode") not in ("kubernetes", "local"):
            raise UsageError(
                f"cluster file {where!r}: mode {data.get('mode')!r} is not allowed; allowed: kubernetes, local"
            )
        secret = ""
        if control:
            if "secret" not in data:
                raise UsageError(
                    f"cluster file {where!r} has no control secret: it was written by an older trainer; allowed: a "
                    "cluster file from this trainer's cluster step (run the pipeline again)"
                )
            secret = check_secret(data["secret"], f"cluster file {where!r}")
        return cls(cluster, control, data["mode"], secret)

    def write(self, directory: str) -> None:
        """Writes cluster.json, with the secret, into `directory` (whole, or not at all).

        On a path, a temporary sibling is created with mode 0600 (a mount without modes, gcsfuse, keeps its own),
        written and renamed, so no reader but its owner ever sees the secret. A store's object takes one PUT.

        Raises:
            NoSpaceError, DeniedError, QuotaError, StoreUnavailableError: the disk or store failed the write
                (`trainer.core.faults`); nothing is left behind.
        """
        path = os.path.join(directory, self.FILE)
        data = json_bytes(dict(self.to_json(), secret=self.secret))
        if "://" in path:
            write_bytes(path, data)
            return
        _write_private(path, data)

    @classmethod
    def read(cls, directory: str) -> ClusterRecord:
        """cluster.json in `directory`, checked.

        Raises:
            UsageError: the file cannot be read or is not a cluster record.
        """
        path = os.path.join(directory, cls.FILE)
        try:
            data = read_json(path)
        except (OSError, ValueError) as err:
            raise UsageError(f"cluster file {path!r} cannot be read: {err}") from None
        return cls.from_json(data, path)


def _write_private(path: str, data: bytes) -> None:
    """Writes `data` to the local `path` whole, readable and writable by its owner only from its creation on."""
    from trainer.core.faults import classify

    check_writable_parent(path)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except Exception as err:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        fault = classify(err, f"write {path!r}")
        if fault is None:
            raise
        raise fault from err


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """worker.json: what a task that is not the chief leaves in its model directory (the chief leaves the model).

    Attributes:
        task: the task, `type:index` (`worker:1`, `ps:0`, `evaluator:0`).
        chief: always False in the file (the chief writes its model instead); the step's metadata says it as well.
    """

    task: str
    chief: bool = False

    FILE: ClassVar[str] = "worker.json"

    @classmethod
    def of(cls, job: str, index: int, chief: bool = False) -> TaskRecord:
        """The record of task `job` `index`."""
        return cls(TaskId(job, index).label, chief)

    def to_json(self) -> dict[str, Any]:
        """The file's content, and the step's artifact metadata."""
        return {"task": self.task, "chief": self.chief}

    def write(self, directory: str) -> None:
        """Writes worker.json into `directory` (created when missing)."""
        os.makedirs(directory, exist_ok=True)
        write_json(os.path.join(directory, self.FILE), self.to_json())
