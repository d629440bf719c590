"""Where the parameter-server chief keeps its status document: a ConfigMap of the run, or a file or object.

    {"state": "running" | "succeeded" | "failed", "heartbeat": <unix time>, "detail": "..."}

`ChiefStatus` is that document as a record and `ChiefState` its states; every store reads and writes it through
`StatusStore.read_status` / `write_status`, the one place where the document is made and read.

On Kubernetes the chief writes it to the ConfigMap `tfw-<run key>-status` in its namespace (`configmap:NAME`),
owned by the run's Argo Workflow like the run's Services, so it goes when the run is deleted; parameter servers
and workers read it through the API, so no volume or bucket is shared. Elsewhere it is a file (a local path for
`trainer-launch`) or an `s3://` / `gs://` object, written whole each time (`trainer.storage.locations`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from enum import Enum
from typing import Any

log = logging.getLogger(__name__)

CONFIGMAP = "configmap:"
KEY = "status.json"


class ChiefState(str, Enum):
    """The chief's state as its status document says it; the value is the document's `state`."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        """Whether the chief is done: no later state follows and its servers may stop."""
        return self is not ChiefState.RUNNING


@dataclasses.dataclass(frozen=True)
class ChiefStatus:
    """The chief's status document.

    Attributes:
        state: where the chief is.
        heartbeat: when the chief last wrote it (unix time); servers take an old one for a vanished chief.
        detail: why the chief failed (its error's first line), else empty.
    """

    state: ChiefState
    heartbeat: float
    detail: str = ""

    def to_document(self) -> dict[str, Any]:
        """The JSON document the stores keep."""
        return {"state": self.state.value, "heartbeat": self.heartbeat, "detail": self.detail}

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> ChiefStatus:
        """The status a document says; a document without a heartbeat is as old as can be.

        Raises:
            ValueError: the document names no state this project writes.
        """
        state = document.get("state") if isinstance(document, Mapping) else None
        try:
            known = ChiefState(state)
        except ValueError:
            allowed = ", ".join(s.value for s in ChiefState)
            raise ValueError(f"the chief's status names the state {state!r}; allowed: {allowed}") from None
        return cls(known, float(document.get("heartbeat") or 0.0), str(document.get("detail") or ""))


class StatusStore:
    """Where the chief's status document is kept: `read` and `write` move the JSON document, whole."""

    where: str
    poll_seconds: float

    def write(self, document: dict[str, Any]) -> None:
        """Replaces the document."""
        raise NotImplementedError

    def read(self) -> dict[str, Any] | None:
        """The document, or None when there is none (yet)."""
        raise NotImplementedError

    def write_status(self, status: ChiefStatus) -> None:
        """Replaces the status."""
        self.write(status.to_document())

    def read_status(self) -> ChiefStatus | None:
        """The status, or None when there is none (yet).

        Raises:
            ValueError: the document names a state this project never writes.
        """
        document = self.read()
        return None if document is None else ChiefStatus.from_document(document)


class FileStatus(StatusStore):
    """The status as one file or object (a path, `s3://BUCKET/KEY`, `gs://BUCKET/KEY`), replaced whole."""

    poll_seconds = 1.0

    def __init__(self, uri: str, endpoint: str = "", refused: str = "") -> None:
        from trainer.storage.locations import Location, scheme_of

        self.where = uri
        head, _, self._name = uri.rstrip("/").rpartition("/")
        if not scheme_of(uri) and not head:
            head = "."
        self._location = Location(head, endpoint, refused)

    def write(self, document: dict[str, Any]) -> None:
        """Replaces the document."""
        self._location.write_json(document, self._name)

    def read(self) -> dict[str, Any] | None:
        """The document, or None when there is none (yet) or it is being replaced."""
        try:
            return self._location.read_json(self._name)
        except ValueError:
            return None
