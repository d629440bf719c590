"""The chief's status, for tasks that serve until the chief is done: parameter servers and their workers.

Parameter servers (and, under ParameterServerStrategy, workers) only run a TensorFlow server; nothing in TensorFlow
tells them the job is over. So the chief publishes a small status document (a ConfigMap of the run on Kubernetes, a
local file, or an s3:// or gs:// object; `trainer.cluster.status`) and refreshes it every `STATUS_INTERVAL` seconds:

    {"state": "running" | "succeeded" | "failed", "heartbeat": <unix time>, "detail": "..."}

`trainer.cluster.status.ChiefStatus` is that document and `ChiefState` its states. The servers' side reads it
(`ChiefWatch`): `succeeded` -> the job is over; `failed` -> ChiefFailedError; no status
within the start-up timeout, or a heartbeat older than the chief timeout (the chief vanished) -> PeerUnavailableError.
This project's parameter-server runner and a TFJob's PS replicas in command mode use it alike. No TensorFlow here.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from trainer.cluster.configmap_status import ConfigMapStatus
from trainer.cluster.status import CONFIGMAP, ChiefState, ChiefStatus, FileStatus, StatusStore
from trainer.core.errors import ChiefFailedError, PeerUnavailableError

log = logging.getLogger(__name__)

STATUS_INTERVAL = 2.0
POLL_INTERVAL = 1.0
FINAL_WRITES = 3


def open_status(uri: str, run_id: str = "", store: Any = None) -> StatusStore:
    """The status store `uri` names: `configmap:NAME` (`trainer.cluster.configmap_status`), or a path or object URI."""
    if uri.startswith(CONFIGMAP):
        return ConfigMapStatus(uri[len(CONFIGMAP) :], run_id)
    return FileStatus(uri, store.endpoint if store else "", store.refused if store else "")


class StatusPublisher:
    """The chief's side: writes the status document now and keeps its heartbeat fresh from a thread.

    Args:
        store: a status URI (`configmap:NAME`, a path, `s3://`, `gs://`) or a store from `trainer.cluster.status`.
    """

    def __init__(self, store: str | StatusStore) -> None:
        self.store = open_status(store) if isinstance(store, str) else store
        self._stop = threading.Event()
        self._state = ChiefState.RUNNING
        self._detail = ""
        self._abandoned = False
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _write(self) -> None:
        self.store.write_status(ChiefStatus(self._state, time.time(), self._detail))

    def _beat(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL):
            try:
                self._write()
            except Exception as err:  # noqa: BLE001 - a missed beat is retried; the servers' timeout is the limit
                log.warning("chief: could not refresh the status heartbeat: %s", err)

    def __enter__(self) -> StatusPublisher:
        self._write()
        self._thread.start()
        return self

    def abandon(self) -> None:
        """Stops the heartbeat without a final state: a retried chief may take over within the servers' timeout."""
        self._abandoned = True

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._stop.set()
        self._thread.join()
        if self._abandoned:
            log.info("chief: its status stays 'running' without a heartbeat until a retried chief takes over")
            return
        lines = str(exc).strip().splitlines() if exc_type else []
        if exc_type:
            self._state, self._detail = ChiefState.FAILED, (lines or [repr(exc)])[0][:300]
        else:
            self._state, self._detail = ChiefState.SUCCEEDED, ""
        for attempt in range(FINAL_WRITES):
            try:
                self._write()
                return
            except Exception as err:
                if attempt == FINAL_WRITES - 1:
                    raise
                log.warning("chief: could not write its final status (%s); trying again", err)
                time.sleep(STATUS_INTERVAL)


class ChiefWatch:
    """A server's side: reads the chief's status and says whether the job is over.

    Its clocks start at its first read. A heartbeat older than `chief_timeout` means the chief vanished only once
    this watch has itself waited that long, so a server that starts (or is retried) beside a chief being retried
    waits for the new chief's first heartbeat; a status that cannot be read (an API hiccup, or a document naming a
    state no chief writes) is retried the same way.

    Args:
        store: a status URI (`configmap:NAME`, a path, `s3://`, `gs://`) or a store from `trainer.cluster.status`.
        startup_timeout: seconds to wait for the first status.
        chief_timeout: the oldest heartbeat that still counts as a live chief, in seconds.
        what: this task's name for the messages.
    """

    def __init__(self, store: str | StatusStore, startup_timeout: float, chief_timeout: float, what: str) -> None:
        self.store = open_status(store) if isinstance(store, str) else store
        self.startup_timeout = startup_timeout
        self.chief_timeout = chief_timeout
        self.what = what
        self.started: float | None = None
        self.last_read = 0.0
        self.next_read = 0.0

    @property
    def poll_seconds(self) -> float:
        """How often to read the status."""
        return max(POLL_INTERVAL, self.store.poll_seconds)

    def over(self) -> bool:
        """True once the chief says it succeeded; False while it runs (or before the next read is due).

        Raises:
            PeerUnavailableError: no status within `startup_timeout`, a heartbeat older than `chief_timeout` for as
                long, or no successful read for `chief_timeout`.
            ChiefFailedError: the chief reported a failure.
        """
        now = time.monotonic()
        if self.started is None:
            self.started = self.last_read = now
        if now < self.next_read:
            return False
        self.next_read = now + self.poll_seconds
        uri = self.store.where
        try:
            status = self.store.read_status()
        except Exception as err:
            if now - self.last_read > self.chief_timeout:
                raise PeerUnavailableError(
                    f"{self.what}: the chief's status at {uri} could not be read for {self.chief_timeout:g}s: {err}"
                ) from None
            log.warning("%s: could not read the chief's status at %s (%s); trying again", self.what, uri, err)
            return False
        self.last_read = now
        if status is None:
            if now - self.started > self.startup_timeout:
                raise PeerUnavailableError(
                    f"{self.what}: the chief published no status at {uri} within {self.startup_timeout:g}s"
                )
            return False
        if status.state is ChiefState.SUCCEEDED:
            log.info("%s: the chief finished successfully; exiting", self.what)
            return True
        if status.state is ChiefState.FAILED:
            raise ChiefFailedError(f"{self.what}: the chief failed: {status.detail}")
        age = time.time() - status.heartbeat
        if age > self.chief_timeout and now - self.started > self.chief_timeout:
            raise PeerUnavailableError(
                f"{self.what}: the chief's heartbeat at {uri} is {age:.0f}s old "
                f"(limit {self.chief_timeout:g}s); the chief vanished"
            )
        return False


def wait_for_chief(store: str | StatusStore, startup_timeout: float, chief_timeout: float, what: str) -> None:
    """A server's side: polls the chief's status until it says the job is over (`ChiefWatch`).

    Raises:
        PeerUnavailableError: no status within `startup_timeout`, or a heartbeat older than `chief_timeout`.
        ChiefFailedError: the chief reported a failure.
    """
    watch = ChiefWatch(store, startup_timeout, chief_timeout, what)
    while not watch.over():
        time.sleep(POLL_INTERVAL / 4)
