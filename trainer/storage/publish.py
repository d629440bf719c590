"""Publishing a model that passed the quality gate: a versioned copy with its metrics, on a path, S3 or GCS.

Layout under `publish_uri`, which TF Serving (`--model_base_path`) and KServe (`storageUri`) read as it is:

    publish_uri/1796222222/saved_model.pb, variables/, assets/, fingerprint.pb, metrics.json
    publish_uri/latest.json      -> {"version": 1796222222, "path": ..., "metrics": {...}, "lineage": {...}}

TF Serving serves the highest child whose name is an integer and ignores every other name, so a version is
assembled under `.staging-<version>-<random>` and only then becomes `<version>`:

- on a path (a volume) by one rename, which is atomic;
- on S3 and GCS, which have no rename, by server-side copies with `saved_model.pb` last: until the copy of that
  one object completes, no reader finds a SavedModel in the version, so none can load half of one.

`latest.json` is replaced whole (one PUT, or write-then-rename) after the version is complete. On any failure the
staging prefix and the unfinished version are removed. A model worse than the one in `latest.json` on the gate's
metric (accuracy by default; `loss` is worse when higher under `loss<=...`) is not published, and a new version
number is always above every existing one, so TF Serving's "latest" policy serves the newest published model. One
publisher at a time per `publish_uri` (a pipeline run publishes once).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
import uuid
from typing import Any

from trainer.config import registry as settings
from trainer.core.errors import UsageError
from trainer.evaluation.gate import Gate
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

LATEST = "latest.json"
METRICS = "metrics.json"
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
STAGING = ".staging-"
ACCURACY = Gate("accuracy", True, 0.0)


@dataclasses.dataclass(frozen=True)
class Latest:
    """latest.json (and each version's metrics.json): a published version, its metrics and its lineage."""

    version: int
    path: str
    metrics: dict[str, Any]
    lineage: dict[str, Any]

    @property
    def accuracy(self) -> float | None:
        """The accuracy the version was published with (None: a model whose evaluation reported none)."""
        return self.value("accuracy")

    def value(self, metric: str) -> float | None:
        """A metric the version was published with (None: its evaluation did not report it)."""
        return float(self.metrics[metric]) if metric in self.metrics else None

    def to_json(self) -> dict[str, Any]:
        """The record as latest.json holds it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Latest:
        """The record from latest.json's content."""
        return cls(int(data["version"]), str(data["path"]), dict(data["metrics"]), dict(data["lineage"]))


@dataclasses.dataclass(frozen=True)
class Publication:
    """What the publish step decided: whether it published, why, and which version latest.json names now.

    Attributes:
        published: a new version was published.
        reason: why, or why not, in one sentence.
        version: the new version's number; None when nothing was published.
        path: the new version's location; empty when nothing was published.
        previous: what latest.json named before; None when nothing was published there.
    """

    published: bool
    reason: str
    version: int | None = None
    path: str = ""
    previous: Latest | None = None

    @property
    def latest(self) -> tuple[int, str]:
        """The version and path latest.json names after this step (0 and "" when nothing is published there)."""
        if self.published:
            return self.version or 0, self.path
        return (self.previous.version, self.previous.path) if self.previous else (0, "")


def latest(publish_uri: str, s3_endpoint: str = "") -> Latest | None:
    """The published `latest.json`, or None when nothing is published there yet."""
    found = Location(publish_uri, s3_endpoint).read_json(LATEST)
    return Latest.from_json(found) if found is not None else None


def versions(target: Location) -> list[int]:
    """The version numbers published under `target`, ascending."""
    return sorted(int(name) for name in target.children() if name.isdigit())


def _promote(target: Location, staging: str, version: str) -> None:
    """Makes the staged version visible as `version`: a rename on a path, copies with the SavedModel last."""
    if not target.is_object_store:
        target.rename_dir(target.path(staging), target.path(version))
        return
    files = target.files(staging)
    for rel in sorted(files, key=lambda f: (f in SAVED_MODEL_FILES, f)):
        target.copy(target.path(staging, rel), target.path(version, rel))
    target.remove(staging)


def _discard(target: Location, *names: str) -> None:
    for name in names:
        try:
            target.remove(name)
        except Exception as err:  # noqa: BLE001 - the original failure is the one to report
            log.warning("could not remove the unfinished %s: %s", target.uri_of(name), err)


def check_target(publish_uri: str, s3_endpoint: str = "") -> None:
    """Refuses a publish location (or endpoint) that can never work, before anything is read or written."""
    if not publish_uri:
        raise UsageError("publish_uri is empty; give a local path, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    settings.check("publish_uri", publish_uri)
    settings.check("s3_endpoint", s3_endpoint)


def publish(
    saved_model_dir: str,
    metrics: dict[str, Any],
    publish_uri: str,
    lineage: dict[str, Any],
    s3_endpoint: str = "",
    refused: str = "",
    gate: Gate = ACCURACY,
) -> Publication:
    """Publishes unless the currently published model is better.

    Args:
        saved_model_dir: the local SavedModel directory to publish.
        metrics: the evaluation's metrics; the gate's metric decides against the published model in the gate's
            direction (a model without it, or against one without it, is published as the newest).
        publish_uri: a path, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`.
        lineage: run, dataset, model URI and training parameters, recorded in `metrics.json` and `latest.json`.
        s3_endpoint: the S3 endpoint URL (SeaweedFS, MinIO); empty: AWS.
        refused: what to add when the store refuses a call (`trainer.storage.kfp.Store.refused`).
        gate: the quality gate, whose metric and direction rank models (default: higher accuracy is better).

    Returns:
        The decision.

    Raises:
        UsageError: no publish location, a location that is not allowed, or no SavedModel to publish.
        StorageError: the storage refused a call (the line names bucket, key and permission).
    """
    check_target(publish_uri, s3_endpoint)
    if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
        raise UsageError(f"model directory {saved_model_dir!r} holds no SavedModel")
    target = Location(publish_uri, s3_endpoint, refused)
    found = target.read_json(LATEST)
    previous = Latest.from_json(found) if found is not None else None
    name = gate.metric
    value = float(metrics[name]) if name in metrics else None
    before = previous.value(name) if previous is not None else None
    if None not in (value, before) and gate.worse(value, before):
        reason = (
            f"not published: {name} {value:.4f} is {'below' if gate.higher_is_better else 'above'} the published "
            f"version {previous.version} ({before:.4f})"
        )
        log.info(reason)
        return Publication(False, reason, previous=previous)
    version = max([int(time.time()), *(v + 1 for v in versions(target))])
    staging = f"{STAGING}{version}-{uuid.uuid4().hex[:8]}"
    record = Latest(version, target.uri_of(str(version)), dict(metrics), dict(lineage))
    try:
        target.upload(saved_model_dir, staging)
        target.write_json(record.to_json(), staging, METRICS)
        _promote(target, staging, str(version))
        target.write_json(record.to_json(), LATEST)
    except BaseException:
        # The version number is new, so everything under it is this attempt's; latest.json is unchanged.
        _discard(target, staging, str(version))
        raise
    if value is None:
        reason = f"published version {version} (no {name} to compare: the newest successful run is published)"
    else:
        if previous is None:
            known = " (first version)"
        elif before is None:
            known = f" (previous version {previous.version} has no {name})"
        else:
            known = f" (previous {before:.4f})"
        reason = f"published version {version} with {name} {value:.4f}{known}"
    log.info("%s at %s", reason, record.path)
    with contextlib.suppress(Exception):
        target.fs.invalidate_cache()
    return Publication(True, reason, version, record.path, previous)
