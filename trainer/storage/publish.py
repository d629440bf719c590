"""Publishing a model that passed the quality gate: a versioned copy with its metrics, on a path, S3 or GCS.

Layout under `publish_uri`, which TF Serving (`--model_base_path`) and KServe (`storageUri`) read as it is:

    publish_uri/1796222222/saved_model.pb, variables/, assets/, fingerprint.pb, metrics.json
    publish_uri/latest.json      -> {"version": 1796222222, "path": ..., "metrics": {...}, "lineage": {...}}
    publish_uri/.claims/1796222222   who claimed that number (hidden: TF Serving loads integer names only)

TF Serving serves the highest child whose name is an integer and ignores every other name, so a version is
assembled under `.staging-<second>-<random>` and only then becomes `<version>`:

- on a path (a volume) by one rename, which is atomic;
- on S3 and GCS, which have no rename, by server-side copies with `saved_model.pb` last: until the copy of that
  one object completes, no reader finds a SavedModel in the version, so none can load half of one.

Several runs may publish to one `publish_uri` at once. Each step that two of them could race on is a conditional
write (`trainer.storage.conditional`), so the end state is the same as if they had published one after another
in the order in which they moved `latest.json`:

1. Read `latest.json` (with its ETag, generation or digest). A model worse on the gate's metric is not published
   ("not published: ... below the published version ...") and nothing is uploaded.
2. Upload the SavedModel to the staging prefix.
3. Claim a version number: the first of `max(now in Unix seconds, highest version + 1, latest + 1)` and the numbers
   after it whose `.claims/<n>` this run creates (O_EXCL, `If-None-Match: *`, `ifGenerationMatch=0`). Two runs in
   the same second never share a number: the one whose claim comes second takes the next.
4. Promote the staging copy to that number, `metrics.json` included.
5. Replace `latest.json` only if it is still what step 1 (or the last pass of 6) read. If another run replaced it
   meanwhile, read it again: a model now worse than the published one withdraws its version (its SavedModel
   first, then the rest, then its claim) and is reported "not published"; a model at least as good keeps its
   version, moved to a new number above the published one if that is higher, and tries again (at most `ATTEMPTS`
   times, then StoreUnavailableError, 142).

So `latest.json` names the best model by the gate's metric (the newest among equals, and the newest when a model
has no value for it), its version is the highest, and every version reported published stays complete under its
own number. A losing version is visible for the moment between its promotion and its withdrawal. On any failure
the staging prefix, the unfinished version and its claim are removed and `latest.json` is unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from trainer.config import registry as settings
from trainer.core.errors import StoreUnavailableError, UsageError
from trainer.core.files import json_bytes
from trainer.evaluation.gate import Gate
from trainer.storage import conditional
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

LATEST = "latest.json"
METRICS = "metrics.json"
CLAIMS = ".claims"
ATTEMPTS = 32  # tries to replace latest.json; each failed one means another run replaced it meanwhile
CLAIM_ATTEMPTS = 256  # numbers tried for a claim; each taken one is another run's
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
    clock: Callable[[], float] = time.time,
) -> Publication:
    """Publishes unless the published model is better, also while other runs publish to the same place.

    Args:
        saved_model_dir: the local SavedModel directory to publish.
        metrics: the evaluation's metrics; the gate's metric decides against the published model in the gate's
            direction (a model without it, or against one without it, is published as the newest).
        publish_uri: a path, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`.
        lineage: run, dataset, model URI and training parameters, recorded in `metrics.json` and `latest.json`.
        s3_endpoint: the S3 endpoint URL (SeaweedFS, MinIO); empty: AWS.
        refused: what to add when the store refuses a call (`trainer.storage.kfp.Store.refused`).
        gate: the quality gate, whose metric and direction rank models (default: higher accuracy is better).
        clock: the time in Unix seconds, the lowest version number to claim.

    Returns:
        The decision.

    Raises:
        UsageError: no publish location, a location that is not allowed, or no SavedModel to publish.
        StorageError: the storage refused or failed a call (the line names bucket, key and permission).
        StoreUnavailableError: `latest.json` kept changing through `ATTEMPTS` tries, or no free number was found.
    """
    check_target(publish_uri, s3_endpoint)
    if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
        raise UsageError(f"model directory {saved_model_dir!r} holds no SavedModel")
    target = Location(publish_uri, s3_endpoint, refused)
    store = conditional.for_location(target)
    value = float(metrics[gate.metric]) if gate.metric in metrics else None
    seen = store.read(LATEST)
    if _loses(gate, value, _record(seen)):
        return _not_published(gate, value, _record(seen))
    run = _Version(target, store, dict(metrics), dict(lineage), clock)
    try:
        target.upload(saved_model_dir, run.staging)
        for _ in range(ATTEMPTS):
            current = _record(seen)
            if _loses(gate, value, current):
                run.withdraw()
                return _not_published(gate, value, current)
            if run.number is None or (current is not None and current.version >= run.number):
                run.place(above=current.version if current is not None else 0)
            if run.replace_latest(seen):
                return _published(gate, value, run, current)
            seen = store.read(LATEST)
            if run.is_named_by(_record(seen)):  # ours landed, though its reply was lost
                return _published(gate, value, run, current)
        raise StoreUnavailableError(
            f"{target.uri_of(LATEST)}: other runs replaced it before each of this run's tries to replace it "
            f"({ATTEMPTS}); the task ends with 142 and is retried when it restarts"
        )
    except BaseException:
        run.discard()
        raise
    finally:
        run.remove_staging()


def _record(found: conditional.Versioned) -> Latest | None:
    return Latest.from_json(json.loads(found.data)) if found.data is not None else None


def _loses(gate: Gate, value: float | None, published: Latest | None) -> bool:
    """Whether a model with `value` of the gate's metric is worse than the published one (never without values)."""
    before = published.value(gate.metric) if published is not None else None
    return value is not None and before is not None and gate.worse(value, before)


def _not_published(gate: Gate, value: float, published: Latest) -> Publication:
    """The decision for a model that `_loses` to the published one."""
    reason = (
        f"not published: {gate.metric} {value:.4f} is {'below' if gate.higher_is_better else 'above'} the "
        f"published version {published.version} ({published.value(gate.metric):.4f})"
    )
    log.info(reason)
    return Publication(False, reason, previous=published)


def _published(gate: Gate, value: float | None, run: _Version, previous: Latest | None) -> Publication:
    name = gate.metric
    record = run.published()
    before = previous.value(name) if previous is not None else None
    if value is None:
        reason = f"published version {record.version} (no {name} to compare: the newest successful run is published)"
    else:
        if previous is None:
            known = " (first version)"
        elif before is None:
            known = f" (previous version {previous.version} has no {name})"
        else:
            known = f" (previous {before:.4f})"
        reason = f"published version {record.version} with {name} {value:.4f}{known}"
    log.info("%s at %s", reason, record.path)
    with contextlib.suppress(Exception):
        run.target.fs.invalidate_cache()
    return Publication(True, reason, record.version, record.path, previous)


class _Version:
    """One run's version under a publish location: staged, claimed, promoted, moved, withdrawn or kept."""

    def __init__(
        self,
        target: Location,
        store: conditional.Store,
        metrics: dict[str, Any],
        lineage: dict[str, Any],
        clock: Callable[[], float],
    ) -> None:
        self.target, self.store, self.metrics, self.lineage, self.clock = target, store, metrics, lineage, clock
        self.staging = f"{STAGING}{int(clock())}-{uuid.uuid4().hex[:8]}"
        self.claim = json_bytes({"claimed_by": uuid.uuid4().hex, "run_id": lineage.get("run_id", "")})
        self.number: int | None = None
        self.claimed: list[int] = []
        self.in_doubt = False
        self.kept = False

    def record(self, number: int) -> Latest:
        """What latest.json and metrics.json say of this run's version under `number`."""
        return Latest(number, self.target.uri_of(str(number)), self.metrics, self.lineage)

    def is_named_by(self, found: Latest | None) -> bool:
        """Whether `found` (latest.json as read) names this version: its number is this run's alone."""
        return found is not None and self.number is not None and found.version == self.number

    def published(self) -> Latest:
        """The record of the placed version, which latest.json now names: from here on it is kept."""
        self.kept = True
        return self.record(self.number)

    def place(self, above: int) -> None:
        """Claims a number above `above` and every version listed now, and puts this version there.

        The first time from the staging copy; later (another run published a higher number meanwhile) by moving
        the version: one rename on a path, copies from staging and the old number's withdrawal on a bucket.
        """
        old = self.number
        self.number = self._claim(max(int(self.clock()), above + 1, *(v + 1 for v in versions(self.target))))
        if old is None or self.target.is_object_store:
            self._promote(self.number)
        else:
            self.target.rename_dir(self.target.path(str(old)), self.target.path(str(self.number)))
            self.target.write_json(self.record(self.number).to_json(), str(self.number), METRICS)
        if old is not None:
            self._release(old)
            log.info("version %d is now %d: another run published %d meanwhile", old, self.number, above)

    def _claim(self, first: int) -> int:
        for number in range(first, first + CLAIM_ATTEMPTS):
            if self.store.create(self.claim, CLAIMS, str(number)):
                self.claimed.append(number)
                if number != first:
                    log.info("version %d: the numbers from %d were claimed by other runs", number, first)
                return number
        raise StoreUnavailableError(
            f"{self.target.uri_of(CLAIMS)}: the {CLAIM_ATTEMPTS} version numbers from {first} on are all claimed; "
            "the task ends with 142 and is retried when it restarts"
        )

    def _release(self, number: int) -> None:
        """Removes what this run placed under `number` (on a path, already renamed away if moved) and its claim."""
        name = str(number)
        if self.target.is_object_store:
            for rel in SAVED_MODEL_FILES:
                self.store.delete(name, rel)
            self.target.remove(name)
        else:
            gone = f"{STAGING}{name}-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):
                self.target.rename_dir(self.target.path(name), self.target.path(gone))
            self.target.remove(gone)
        self.store.delete(CLAIMS, name)
        self.claimed.remove(number)

    def _promote(self, number: int) -> None:
        """Makes the staged copy visible as `number`: a rename on a path, copies with the SavedModel last."""
        name, record = str(number), self.record(number).to_json()
        if not self.target.is_object_store:
            self.target.write_json(record, self.staging, METRICS)
            self.target.rename_dir(self.target.path(self.staging), self.target.path(name))
            return
        files = [f for f in self.target.files(self.staging) if f != METRICS]
        for rel in sorted(files, key=lambda f: f in SAVED_MODEL_FILES):
            if rel in SAVED_MODEL_FILES:
                self.target.write_json(record, name, METRICS)
            self.target.copy(self.target.path(self.staging, rel), self.target.path(name, rel))

    def replace_latest(self, seen: conditional.Versioned) -> bool:
        """Replaces latest.json with this version's record if it is still `seen`; whether it did."""
        self.in_doubt = True
        replaced = self.store.replace(json_bytes(self.record(self.number).to_json()), seen, LATEST)
        self.in_doubt = False
        return replaced

    def withdraw(self, why: str = "a better model was published meanwhile") -> None:
        """Removes every number this run claimed (its version first: its SavedModel goes before the rest)."""
        withdrawn, self.number = self.number, None
        for number in list(self.claimed):
            self._release(number)
        if withdrawn is not None:
            log.info("withdrew version %d: %s", withdrawn, why)

    def discard(self) -> None:
        """After a failure: removes the unfinished version and its claim, unless latest.json may name it."""
        if self.kept or not self.claimed:
            return
        if self.in_doubt:
            try:
                named = self.is_named_by(_record(self.store.read(LATEST)))
            except Exception as err:  # noqa: BLE001 - the original failure is the one to report
                log.warning("kept version %s: whether latest.json names it is unknown (%s)", self.number, err)
                return
            if named:
                log.warning("kept version %d: latest.json names it", self.number)
                return
        try:
            self.withdraw("this run failed")
        except Exception as err:  # noqa: BLE001 - the original failure is the one to report
            log.warning("could not remove the unfinished version %s: %s", self.number, err)

    def remove_staging(self) -> None:
        """Removes the staging prefix (on a path it is gone once promoted); a failure here is only logged."""
        try:
            self.target.remove(self.staging)
        except Exception as err:  # noqa: BLE001 - the publication's outcome stands
            log.warning("could not remove the staging copy %s: %s", self.target.uri_of(self.staging), err)
