"""Publishing a model that passed the quality gate: a versioned copy with its metrics, on a path, S3 or GCS.

Layout under `publish_uri`, which TF Serving (`--model_base_path`) and KServe (`storageUri`) read as it is:

    publish_uri/1796222222/saved_model.pb, variables/, assets/, fingerprint.pb, metrics.json
    publish_uri/latest.json      -> {"version": 1796222222, "path": ..., "metrics": {...}, "lineage": {...}}
    publish_uri/.claims/1796222222   who claimed that number and when (hidden: TF Serving loads integer names only)

TF Serving serves the highest child whose name is an integer and ignores every other name, so a version is
assembled under `.staging-<second>-<random>` and only then becomes `<version>`:

- on a path (a volume) by one rename, which is atomic;
- on S3 and GCS, which have no rename, by server-side copies with `saved_model.pb` last: until the copy of that
  one object completes, no reader finds a SavedModel in the version, so none can load half of one.

Several runs may publish to one `publish_uri` at once. Each step that two of them could race on is a conditional
write (`trainer.publishing.conditional`), so the end state is the same as if they had published one after another
in the order in which they moved `latest.json`:

0. Withdraw what dead runs left above `latest.json`'s version: a number claimed more than `STALE_CLAIM` seconds
   ago (longer than any promotion takes: the upload comes before the claim) that `latest.json` does not name, its
   SavedModel first. A run stopped between promoting its version and replacing `latest.json` leaves one, and TF
   Serving would serve it as the highest number.
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
own number. A losing version is visible for the moment between its promotion and its withdrawal. On any failure,
SIGTERM included (turned into SystemExit(143) for the duration of `publish`), the staging prefix, the unfinished
version and its claim are removed and `latest.json` is unchanged; after SIGKILL, step 0 of a later publish does it.

On an S3 server that ignores conditional writes (`conditional.Store.atomic` False) a claim is "read, put, read
back", which two runs can both pass. There a version number is `seconds * SPREAD` plus a random part below
`SPREAD` (still an integer, as TF Serving and KServe need), so two runs share one only if they draw the same part
for the same base; a number that already holds a version is not used; after promotion the claim and
`metrics.json` must still be this run's, else the run leaves that number to the other and takes another; and
after replacing `latest.json` the run reads back the versions promoted since it started: a better one is named
again in `latest.json` (ours withdrawn), a worse one numbered higher makes ours move above it. What stays
unguarded there: two runs drawing the same number whose copies overlap (one of them can keep a mix), and a write
delayed past the other runs' checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from trainer.config import settings
from trainer.config.gate import Gate
from trainer.core.errors import EXIT_TERMINATED, StoreUnavailableError, UsageError
from trainer.core.files import json_bytes
from trainer.publishing import conditional
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

LATEST = "latest.json"
METRICS = "metrics.json"
CLAIMS = ".claims"
ATTEMPTS = 32  # tries to replace latest.json; each failed one means another run replaced it meanwhile
CLAIM_ATTEMPTS = 256  # numbers tried for a claim; each taken one is another run's
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
STAGING = ".staging-"
STALE_CLAIM = 3600  # seconds after which a claimed number above latest.json's is a dead run's leftover
SPREAD = 1000  # on a store that ignores conditional writes: version = seconds * SPREAD + a random part below it
ACCURACY = Gate("accuracy", True, 0.0)
RETRY_NOTE = "the step ends with 142 (a store fault that a later run or a KFP retry of the run may not meet)"


def random_part() -> int:
    """The random part of a version number on a store that ignores conditional writes: 0 to SPREAD - 1."""
    return secrets.randbelow(SPREAD)


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
    nonce: Callable[[], int] = random_part,
) -> Publication:
    """Publishes unless the published model is better, also while other runs publish to the same place.

    Args:
        saved_model_dir: the local SavedModel directory to publish.
        metrics: the evaluation's metrics; the gate's metric decides against the published model in the gate's
            direction (a model without it, or against one without it, is published as the newest).
        publish_uri: a path, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`.
        lineage: run, dataset, model URI and training parameters, recorded in `metrics.json` and `latest.json`.
        s3_endpoint: the S3 endpoint URL (SeaweedFS, MinIO); empty: AWS.
        refused: what to add when the store refuses a call (`trainer.storage.kfpstore.Store.refused`).
        gate: the quality gate, whose metric and direction rank models (default: higher accuracy is better).
        clock: the time in Unix seconds: the lowest version number to claim, and what claims' ages are taken from.
        nonce: the random part (0 to SPREAD - 1) of a version number on a store that ignores conditional writes.

    Returns:
        The decision.

    Raises:
        UsageError: no publish location, a location that is not allowed, or no SavedModel to publish.
        StorageError: the storage refused or failed a call (the line names bucket, key and permission).
        StoreUnavailableError: `latest.json` kept changing through `ATTEMPTS` tries, or no free number was found.
        SystemExit: SIGTERM arrived (code 143), after this run's unfinished version was withdrawn.
    """
    check_target(publish_uri, s3_endpoint)
    if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
        raise UsageError(f"model directory {saved_model_dir!r} holds no SavedModel")
    target = Location(publish_uri, s3_endpoint, refused)
    store = conditional.for_location(target)
    with _sigterm_exits():
        return _publish(saved_model_dir, metrics, target, store, lineage, gate, clock, nonce)


def _publish(
    saved_model_dir: str,
    metrics: dict[str, Any],
    target: Location,
    store: conditional.Store,
    lineage: dict[str, Any],
    gate: Gate,
    clock: Callable[[], float],
    nonce: Callable[[], int],
) -> Publication:
    started = clock()
    value = float(metrics[gate.metric]) if gate.metric in metrics else None
    seen = store.read(LATEST)
    first = _record(seen)
    withdraw_stale(target, store, first, started)
    if _loses(gate, value, first):
        return _not_published(gate, value, first)
    run = _Version(target, store, dict(metrics), dict(lineage), clock, nonce, started)
    since = first.version if first is not None else 0
    try:
        target.upload(saved_model_dir, run.staging)
        top = 0  # a number this version must be above: latest.json's, or a worse version's numbered above it
        previous = first
        for _ in range(ATTEMPTS):
            current = _record(seen)
            if _loses(gate, value, current):
                run.withdraw()
                return _not_published(gate, value, current)
            if not run.owns(current):
                previous = current
            top = max(top, current.version if current is not None else 0)
            if run.number is None or top >= run.number:
                run.place(above=top)
            if run.replace_latest(seen):
                rival = None if store.atomic else run.rival(gate, value, since)
                if rival is None:
                    return _published(gate, value, run, previous)
                if _loses(gate, value, rival):
                    run.restore(rival)
                    run.withdraw(f"version {rival.version}, promoted meanwhile, is better")
                    return _not_published(gate, value, rival)
                top = rival.version
                seen = store.read(LATEST)
                continue
            seen = store.read(LATEST)
            if run.is_named_by(_record(seen)):  # ours landed, though its reply was lost
                return _published(gate, value, run, previous)
        raise StoreUnavailableError(
            f"{target.uri_of(LATEST)}: other runs replaced it before each of this run's tries to replace it "
            f"({ATTEMPTS}); {RETRY_NOTE}"
        )
    except BaseException:
        run.discard()
        raise
    finally:
        run.remove_staging()


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """For its duration SIGTERM raises SystemExit(143), so `_Version.discard` runs; the old handler is restored.

    Kubernetes sends SIGTERM when it stops the pod (a cancelled run, a drained node) and SIGKILL after the grace
    period. Python's default for SIGTERM ends the process at once, which would leave a promoted version that
    latest.json does not name and TF Serving serves as the highest number. Only the main thread can take signals;
    in another thread nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: let the clean-up finish
        log.warning("publish stopped by SIGTERM: an unfinished version is withdrawn, then the step ends with 143")
        raise SystemExit(EXIT_TERMINATED)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def withdraw_stale(target: Location, store: conditional.Store, named: Latest | None, now: float) -> list[int]:
    """Withdraws the versions that runs stopped midway left above latest.json's; returns their numbers.

    A version numbered above the one `named` (latest.json as read) whose claim is older than `STALE_CLAIM` seconds
    belongs to a run that promoted it (all or part of it) and never named it in latest.json: it was killed, or its
    clean-up failed. Each is withdrawn, its SavedModel first, and logged in one line. Younger ones are left to the runs
    publishing them; a version without a dated claim (made before claims were dated) is left and logged.

    Args:
        target: the publish location.
        store: its conditional operations.
        named: what latest.json names now; None when there is none (then every version counts).
        now: the time in Unix seconds.
    """
    floor = named.version if named is not None else -1
    withdrawn = []
    for number in [v for v in versions(target) if v > floor]:
        claim = _claim_of(store.read(CLAIMS, str(number)).data)
        if "claimed_at" not in claim:
            log.info("version %d is above latest.json's and has no dated claim: left as it is", number)
            continue
        age = now - float(claim["claimed_at"])
        if age < STALE_CLAIM:
            log.info("version %d above latest.json's, claimed %.0f s ago: left to the run publishing it", number, age)
            continue
        _remove_version(target, store, number)
        withdrawn.append(number)
        log.warning(
            "withdrew version %d: claimed %.0f s ago by run %r, which never named it in latest.json (stopped "
            "between its claim and latest.json); TF Serving would have served it as the highest number",
            number,
            age,
            claim.get("run_id", ""),
        )
    return withdrawn


def _claim_of(data: bytes | None) -> dict[str, Any]:
    try:
        found = json.loads(data) if data is not None else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _remove_version(target: Location, store: conditional.Store, number: int) -> None:
    """Removes the version `number` (its SavedModel first on a bucket; one rename away on a path) and its claim."""
    name = str(number)
    if target.is_object_store:
        for rel in SAVED_MODEL_FILES:
            store.delete(name, rel)
        target.remove(name)
    else:
        gone = f"{STAGING}{name}-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(FileNotFoundError):
            target.rename_dir(target.path(name), target.path(gone))
        target.remove(gone)
    store.delete(CLAIMS, name)


def _record(found: conditional.Versioned) -> Latest | None:
    return Latest.from_json(json.loads(found.data)) if found.data is not None else None


def _loses(gate: Gate, value: float | None, published: Latest | None) -> bool:
    """Whether a model with `value` of the gate's metric is worse than the published one (never without values)."""
    before = published.value(gate.metric) if published is not None else None
    return value is not None and before is not None and gate.worse(value, before)


def _beats(gate: Gate, value: float | None, other: Latest) -> bool:
    """Whether a model with `value` is strictly better than `other` (never without values)."""
    theirs = other.value(gate.metric)
    return value is not None and theirs is not None and gate.worse(theirs, value)


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
        nonce: Callable[[], int],
        started: float,
    ) -> None:
        self.target, self.store, self.metrics, self.lineage = target, store, metrics, lineage
        self.clock, self.nonce = clock, nonce
        self.staging = f"{STAGING}{int(started)}-{uuid.uuid4().hex[:8]}"
        self.owner = uuid.uuid4().hex
        self.claim = b""  # written at the first claim, with its time
        self.number: int | None = None
        self.claimed: list[int] = []
        self.placed: set[int] = set()
        self.in_doubt = False
        self.kept = False

    def record(self, number: int) -> Latest:
        """What latest.json and metrics.json say of this run's version under `number`."""
        return Latest(number, self.target.uri_of(str(number)), self.metrics, self.lineage)

    def is_named_by(self, found: Latest | None) -> bool:
        """Whether `found` (latest.json as read) names this version: its number is this run's alone."""
        return found is not None and self.number is not None and found.version == self.number

    def owns(self, found: Latest | None) -> bool:
        """Whether `found` names a number this run placed its version under (now or before it moved)."""
        return found is not None and found.version in self.placed and found.metrics == self.metrics

    def published(self) -> Latest:
        """The record of the placed version, which latest.json now names: from here on it is kept."""
        self.kept = True
        return self.record(self.number)

    def place(self, above: int) -> None:
        """Claims a number above `above` and every version listed now, and puts this version there.

        The first time from the staging copy; later (another run published a higher number meanwhile) by moving
        the version: one rename on a path, copies from staging and the old number's withdrawal on a bucket. On a
        store that ignores conditional writes, a number whose claim or metrics.json is another run's after the
        promotion is left to that run and another is claimed.
        """
        old = self.number
        for _ in range(CLAIM_ATTEMPTS):
            self.number = self._claim(above)
            self.placed.add(self.number)
            if old is None or self.target.is_object_store:
                self._promote(self.number)
            else:
                self.target.rename_dir(self.target.path(str(old)), self.target.path(str(self.number)))
                self.target.write_json(self.record(self.number).to_json(), str(self.number), METRICS)
            if self.store.atomic or self._holds(self.number):
                break
            log.warning(
                "version %d: another run claimed it at the same moment (the store ignores conditional writes) and "
                "wrote its claim or metrics.json after this run's promotion; this run leaves the number to it and "
                "takes another",
                self.number,
            )
            self.claimed.remove(self.number)
            self.number = None
        else:
            raise StoreUnavailableError(
                f"{self.target.uri_of(CLAIMS)}: {CLAIM_ATTEMPTS} numbers claimed by this run were taken over by "
                f"other runs; {RETRY_NOTE}"
            )
        if old is not None:
            self._release(old)
            log.info("version %d is now %d: another run published %d meanwhile", old, self.number, above)

    def _claim(self, above: int) -> int:
        """Claims a free number above `above`, every listed version, and (conditions honoured) the current second.

        Where the store honours conditional writes, the first free one of consecutive numbers; where it does not,
        `seconds * SPREAD` (or the floor, if higher) plus a random part, drawn again while taken or occupied.
        """
        now = int(self.clock())
        if not self.claim:
            self.claim = json_bytes(
                {"claimed_by": self.owner, "run_id": self.lineage.get("run_id", ""), "claimed_at": now}
            )
        floor = max([above + 1, *(v + 1 for v in versions(self.target))])
        atomic = self.store.atomic
        first = max(now, floor) if atomic else max(now * SPREAD, floor)
        for attempt in range(CLAIM_ATTEMPTS):
            number = first + attempt if atomic else first + self.nonce()
            if number in self.placed or not self.store.create(self.claim, CLAIMS, str(number)):
                continue
            if not atomic and self.target.files(str(number)):
                log.warning(
                    "version %d holds another run's version though its claim read back as this run's (the store "
                    "ignores conditional writes): drawing another number",
                    number,
                )
                continue
            self.claimed.append(number)
            if atomic and number != first:
                log.info("version %d: the numbers from %d were claimed by other runs", number, first)
            return number
        raise StoreUnavailableError(
            f"{self.target.uri_of(CLAIMS)}: {CLAIM_ATTEMPTS} version numbers from {first} on were all claimed; "
            f"{RETRY_NOTE}"
        )

    def _holds(self, number: int) -> bool:
        """Whether `number`'s claim and metrics.json are still this run's (read back after the promotion)."""
        if self.store.read(CLAIMS, str(number)).data != self.claim:
            return False
        found = self.store.read(str(number), METRICS).data
        return found is not None and json.loads(found) == self.record(number).to_json()

    def rival(self, gate: Gate, value: float | None, since: int) -> Latest | None:
        """A store without conditional writes, after latest.json was replaced: a version that changes the outcome.

        Among the complete versions (a SavedModel and a metrics.json naming them) numbered above `since` other
        than this run's: the best one if it beats this model; else the highest one that this model beats and
        that is numbered above it (TF Serving would serve it); else None.
        """
        found = []
        for number in versions(self.target):
            if number <= since or number == self.number:
                continue
            record = self._complete(number)
            if record is not None:
                found.append(record)
        better = [r for r in found if _loses(gate, value, r)]
        if better:
            sign = 1 if gate.higher_is_better else -1
            return max(better, key=lambda r: (sign * (r.value(gate.metric) or 0.0), r.version))
        above = [r for r in found if r.version > (self.number or 0) and _beats(gate, value, r)]
        return max(above, key=lambda r: r.version) if above else None

    def _complete(self, number: int) -> Latest | None:
        """The record of version `number` if it is complete (metrics.json naming it, a SavedModel); else None."""
        found = self.store.read(str(number), METRICS).data
        try:
            record = Latest.from_json(json.loads(found)) if found is not None else None
        except (ValueError, KeyError, TypeError):
            return None
        if record is None or record.version != number:
            return None
        if not any(self.target.exists(str(number), rel) for rel in SAVED_MODEL_FILES):
            return None
        return record

    def restore(self, better: Latest) -> None:
        """Names `better` in latest.json again, unless latest.json no longer names this version."""
        self.kept, self.in_doubt = False, True
        found = self.store.read(LATEST)
        if self.is_named_by(_record(found)) and self.store.replace(json_bytes(better.to_json()), found, LATEST):
            log.warning(
                "latest.json named this run's version %d over version %d, better and promoted meanwhile: named %d "
                "again",
                self.number,
                better.version,
                better.version,
            )
        self.in_doubt = False

    def _release(self, number: int) -> None:
        """Removes what this run placed under `number` (on a path, already renamed away if moved) and its claim."""
        _remove_version(self.target, self.store, number)
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
        if replaced:
            self.kept = True
        self.in_doubt = False
        return replaced

    def withdraw(self, why: str = "a better model was published meanwhile") -> None:
        """Removes every number this run claimed (its version first: its SavedModel goes before the rest)."""
        withdrawn, self.number, self.kept = self.number, None, False
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
