"""Where the parameter-server chief keeps its status document: a ConfigMap of the run, or a file or object.

    {"state": "running" | "succeeded" | "failed", "heartbeat": <unix time>, "detail": "..."}

On Kubernetes the chief writes it to the ConfigMap `tfw-<run key>-status` in its namespace (`configmap:NAME`),
owned by the run's Argo Workflow like the run's Services, so it goes when the run is deleted; parameter servers
and workers read it through the API, so no volume or bucket is shared. Elsewhere it is a file (a local path for
`trainer-launch`) or an `s3://` / `gs://` object, written whole each time (`trainer.storage.locations`).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

CONFIGMAP = "configmap:"
KEY = "status.json"


class FileStatus:
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


def open_status(uri: str, run_id: str = "", store: Any = None) -> Any:
    """The status store `uri` names: `configmap:NAME` (`trainer.k8s.status`), or a path or object URI in `store`."""
    if uri.startswith(CONFIGMAP):
        from trainer.k8s.status import ConfigMapStatus

        return ConfigMapStatus(uri[len(CONFIGMAP) :], run_id)
    return FileStatus(uri, store.endpoint if store else "", store.refused if store else "")
