"""Where a training task keeps its latest epoch checkpoint, and how a task without one gets a peer's copy.

Every worker of a MultiWorkerMirroredStrategy cluster holds the same variables, so each keeps its own copy of the
latest checkpoint in its *home*, `ROOT/<run key>/<task>` (for example `/mnt/checkpoints/r1a2b3c4d5/worker-1`):

    ROOT/worker-1/ckpt-3.index, ckpt-3.data-00000-of-00001   TensorFlow's checkpoint after epoch 3
    ROOT/worker-1/resume.json   {"epoch": 3, "prefix": "ckpt-3", "files": [...], "epochs": [per-epoch results]}

The manifest is replaced whole after TensorFlow has written the checkpoint, so it only ever names a complete one.
Before every (re)start of a cluster the workers' supervisors agree on where to resume: the latest epoch any of
them holds (`agree`). A task that lacks it (a replaced pod starts with an empty disk) receives it from a peer that
has it over the run's control channel (`send` / `HandOver`, resumed after a broken connection), so all resume from
the same epoch. When no task has one, all start again from epoch 1. ROOT is `checkpoint_dir` (a volume or `gs://`
keeps it when a pod is lost), else a directory inside the pod.

The run key (`trainer.core.runs`) keeps runs that share a ROOT apart: a restarted or replaced task of the same run
finds its home again, a new run (the next scheduled night, a re-submit, a concurrent trial) starts from epoch 1 and
never touches another run's files. A successful run removes its own directory; what a failed or cancelled run left
is removed by the first task of a later run once nothing in it has been written for `STALE_AFTER_SECONDS`
(`clean_leftovers`). No TensorFlow here: the supervisor uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any

from trainer.cluster.control import MAX_LINE, seal, sealed
from trainer.core.errors import (
    DeniedError,
    NoSpaceError,
    PeerUnavailableError,
    QuotaError,
    StorageFaultError,
)
from trainer.core.files import write_json
from trainer.core.runs import is_run_key, run_key
from trainer.core.tasks import TaskId
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

MANIFEST = "resume.json"
CHUNK = 1 << 20
HANDOVER_PREFIX = ".handover-"
PLAN = "plan.json"
MAX_HEADER = 1 << 20
PROGRESS_SECONDS = 5.0
STALE_AFTER_SECONDS = 24 * 3600
_TASK_DIR = re.compile(r"^(chief|worker|ps|evaluator)-\d+$")
_CHECKPOINT_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-\d{5}-of-\d{5})$")


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A complete checkpoint in a task's home: the epochs it covers, its files, and the epochs' results so far."""

    epoch: int
    files: tuple[str, ...]
    epochs: tuple[dict[str, Any], ...] = ()

    @property
    def prefix(self) -> str:
        """TensorFlow's checkpoint prefix (the files' common stem), relative to the home."""
        return f"ckpt-{self.epoch}"

    def to_json(self) -> dict[str, Any]:
        """The manifest as resume.json holds it."""
        return {"epoch": self.epoch, "prefix": self.prefix, "files": list(self.files), "epochs": list(self.epochs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        """The manifest from resume.json; ValueError when it is not one."""
        epoch, files = data.get("epoch"), data.get("files")
        if not isinstance(epoch, int) or epoch < 1 or not isinstance(files, list) or not files:
            raise ValueError(f"not a checkpoint manifest: {json.dumps(data)[:200]}")
        for name in files:
            match = _CHECKPOINT_FILE.match(str(name))
            if not match or int(match.group(1)) != epoch:
                raise ValueError(f"checkpoint manifest of epoch {epoch} names a foreign file {name!r}")
        return cls(epoch, tuple(files), tuple(data.get("epochs") or ()))


def task_dir(tf_config: Mapping[str, Any] | None) -> str:
    """The home's name for this task: `worker-1`, `chief-0`; `worker-0` for a process without a cluster."""
    return TaskId.of(tf_config).directory


class CheckpointHome:
    """One task's checkpoint directory: a local or volume path, or `gs://BUCKET/PREFIX` (through fsspec)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self._location = Location(self.uri)

    def __repr__(self) -> str:
        return f"CheckpointHome({self.uri!r})"

    def prefix(self, epoch: int) -> str:
        """Where TensorFlow writes (and reads) the checkpoint after `epoch`: `HOME/ckpt-EPOCH`."""
        return f"{self.uri}/ckpt-{epoch}"

    def latest(self) -> Manifest | None:
        """The latest complete checkpoint here, or None (no home yet, or a manifest that is not one)."""
        try:
            data = self._location.read_json(MANIFEST)
        except ValueError as err:
            log.warning("ignoring the checkpoint manifest in %s: %s", self.uri, err)
            return None
        if data is None:
            return None
        try:
            return Manifest.from_json(data)
        except ValueError as err:
            log.warning("ignoring the checkpoint manifest in %s: %s", self.uri, err)
            return None

    def epoch(self) -> int:
        """The epoch of the latest complete checkpoint here; 0 when there is none."""
        latest = self.latest()
        return latest.epoch if latest else 0

    def commit(self, epoch: int, epochs: list[dict[str, Any]] | tuple[dict[str, Any], ...] = ()) -> Manifest:
        """Records the checkpoint TensorFlow has just written at `prefix(epoch)`, then drops every older one."""
        files = tuple(sorted(n for n in self._location.children() if _epoch_of(n) == epoch))
        manifest = Manifest(epoch, files, tuple(epochs))
        self._location.write_json(manifest.to_json(), MANIFEST)
        for name in self._location.children():
            if (found := _epoch_of(name)) is not None and found != epoch:
                self._location.remove(name)
        return manifest

    def clear(self, remove_root: bool = False) -> None:
        """Removes the home and everything in it (after a successful run), then the run's directory once empty.

        With `remove_root`, also ROOT when empty (a default ROOT this run made).
        """
        self._location.remove()
        if self._location.is_object_store:
            return
        parent = os.path.dirname(self._location.root)
        empty = [parent] if is_run_key(os.path.basename(parent)) else []
        for directory in [*empty, os.path.dirname(empty[0]) if empty else parent] if remove_root else empty:
            with contextlib.suppress(OSError):
                os.rmdir(directory)

    def send(self, epoch: int, out: IO[bytes], key: bytes, offset: int = 0, prefix_sha256: str = "") -> None:
        """Writes the checkpoint of `epoch` to `out`: a JSON header line, the files' bytes, a JSON trailer line.

        The files' bytes follow each other in the manifest's order. When `offset` is set and the first `offset` of
        them hash to `prefix_sha256` (what a receiver kept from a broken transfer), only the bytes from `offset` on
        are sent; otherwise all. Header and trailer are sealed with `key` (the transfer's key); the trailer holds
        the SHA-256 of all the bytes.

        Raises:
            FileNotFoundError: this home holds no checkpoint of `epoch`.
        """
        manifest = self.latest()
        if manifest is None or manifest.epoch != epoch:
            raise FileNotFoundError(f"{self.uri} holds no checkpoint of epoch {epoch}")
        sizes = [self._location.fs.size(self._location.path(name)) for name in manifest.files]
        digest, start = hashlib.sha256(), 0
        if 0 < offset <= sum(sizes) and prefix_sha256:
            prefix = self._digest(manifest.files, sizes, offset)
            if prefix.hexdigest() == prefix_sha256:
                digest, start = prefix, offset
        header: dict[str, Any] = {"manifest": manifest.to_json(), "sizes": sizes, "offset": start}
        header["mac"] = seal(key, "header", header)
        out.write(json.dumps(header).encode() + b"\n")
        position = 0
        for name, size in zip(manifest.files, sizes, strict=True):
            if position + size > start:
                skip = max(0, start - position)
                with self._location.fs.open(self._location.path(name), "rb") as f:
                    f.seek(skip)
                    for chunk in _chunks(f, size - skip, name):
                        digest.update(chunk)
                        out.write(chunk)
            position += size
        trailer = {"sha256": digest.hexdigest(), "header": header["mac"]}
        out.write(json.dumps({"sha256": trailer["sha256"], "mac": seal(key, "trailer", trailer)}).encode() + b"\n")
        out.flush()

    def _digest(self, files: Sequence[str], sizes: Sequence[int], length: int) -> Any:
        """The SHA-256 of the first `length` bytes of `files` one after the other."""
        digest = hashlib.sha256()
        for name, size in zip(files, sizes, strict=True):
            if length <= 0:
                break
            with self._location.fs.open(self._location.path(name), "rb") as f:
                for chunk in _chunks(f, min(size, length), name):
                    digest.update(chunk)
            length -= size
        return digest

    def hand_over(self, epoch: int, name: str = "", check: Callable[[], None] = lambda: None) -> HandOver:
        """A hand-over of the checkpoint of `epoch` into this home (see `HandOver`)."""
        return HandOver(self, epoch, name, check)


def _chunks(f: IO[bytes], length: int, name: str) -> Iterator[bytes]:
    """`length` bytes of `f` in chunks; OSError when the file ends first (it changed under the reader)."""
    while length:
        chunk = f.read(min(CHUNK, length))
        if not chunk:
            raise OSError(f"{name} ended {length} bytes before its size")
        length -= len(chunk)
        yield chunk


class HandOver:
    """The checkpoint of one epoch being received from a peer into a home, resumable after a broken connection.

    What arrives is kept in a staging area, `HOME/.handover-EPOCH/` for a home on a path (the same disk: the files
    are moved into the home once verified), or a local temporary directory for a `gs://` or `s3://` home (uploaded
    once verified). The area remembers what arrived: a later `receive` from the same or another peer asks for the
    rest only (`resume_point`), and the peer sends from there when its own first bytes hash the same. Every byte is
    checked against the sender's SHA-256 at the end, whichever transfer brought it; a mismatch discards the area.
    A full disk ends the hand-over with `NoSpaceError` (exit 3) and removes the area; the home's own checkpoint is
    never touched until the new one is complete.

    Args:
        home: where the checkpoint goes.
        epoch: its epoch.
        name: how log lines name this task (`worker 1`).
        check: called with every chunk; raises to stop the hand-over (a signal).
    """

    def __init__(self, home: CheckpointHome, epoch: int, name: str = "", check: Callable[[], None] = lambda: None):
        self.home = home
        self.epoch = epoch
        self.name = name or home.uri
        self.check = check
        self.received = 0
        self.total: int | None = None
        self.kept = 0
        self.position = 0
        self.last_byte = time.monotonic()
        self._prefix: tuple[int, Any] = (0, hashlib.sha256())
        if home._location.is_object_store:
            key = hashlib.sha1(home.uri.encode()).hexdigest()[:16]
            parent = os.path.join(tempfile.gettempdir(), "trainer-handover", key)
        else:
            parent = home._location.root
        self.area = os.path.join(parent, f"{HANDOVER_PREFIX}{epoch}")
        with contextlib.suppress(OSError):
            for entry in os.listdir(parent):
                if entry.startswith(HANDOVER_PREFIX) and entry != os.path.basename(self.area):
                    shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)

    def _plan(self) -> tuple[list[str], list[int]] | None:
        """The files and sizes an earlier transfer announced, when the area holds its record."""
        try:
            with open(os.path.join(self.area, PLAN)) as f:
                plan = json.load(f)
            files, sizes = [str(n) for n in plan["files"]], [int(s) for s in plan["sizes"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if len(files) != len(sizes) or any(not _CHECKPOINT_FILE.match(n) for n in files):
            return None
        return files, sizes

    def resume_point(self) -> tuple[int, str]:
        """How many bytes the area holds from an earlier transfer, and their SHA-256 ((0, "") for none)."""
        digest, offset = hashlib.sha256(), 0
        plan = self._plan()
        for name, size in zip(*plan, strict=True) if plan else ():
            path = os.path.join(self.area, name)
            have = min(os.path.getsize(path), size) if os.path.exists(path) else 0
            if have:
                with open(path, "rb") as f:
                    for chunk in _chunks(f, have, name):
                        digest.update(chunk)
            offset += have
            if have < size:
                break
        self._prefix = (offset, digest)
        return offset, digest.hexdigest() if offset else ""

    def receive(self, source: IO[bytes], where: str, key: bytes) -> Manifest:
        """Reads what `send` wrote (from the offset of `resume_point`), checks it, and makes it the home's latest.

        Raises:
            PeerUnavailableError: the stream ended early, is not sealed with `key`, or does not match its checksum
                (retryable; what arrived intact is kept for the next attempt).
            NoSpaceError, QuotaError, DeniedError: the staging area or the home cannot take the checkpoint.
        """
        manifest, sizes, offset = self._header(source, where, key)
        total = sum(sizes)
        self.total = total
        digest = self._prefix[1].copy() if offset else hashlib.sha256()
        started, self.kept, self.position = time.monotonic(), offset, offset
        next_line = started + PROGRESS_SECONDS
        try:
            if not offset:
                shutil.rmtree(self.area, ignore_errors=True)
            self._check_space(total - offset, total, where)
            os.makedirs(self.area, exist_ok=True)
            write_json(os.path.join(self.area, PLAN), {"files": list(manifest.files), "sizes": sizes})
            position = 0
            for name, size in zip(manifest.files, sizes, strict=True):
                path = os.path.join(self.area, name)
                if position + size <= offset:
                    position += size
                    continue
                skip = max(0, offset - position)
                with open(path, "r+b" if skip else "wb") as f:
                    f.truncate(skip)
                    f.seek(skip)
                    left = size - skip
                    while left:
                        chunk = self._read(source, min(CHUNK, left), where, position + size - left, total)
                        f.write(chunk)
                        digest.update(chunk)
                        left -= len(chunk)
                        self.position = position + size - left
                        self.received += len(chunk)
                        self.last_byte = now = time.monotonic()
                        self.check()
                        if now >= next_line:
                            next_line = now + PROGRESS_SECONDS
                            self._progress(where, self.position, total, started, offset)
                position += size
            self._trailer(source, where, key, digest)
            self._install(manifest)
        except OSError as err:
            raise self._fault(err, where, total) from None
        self._progress(where, total, total, started, offset, finished=True)
        return manifest

    def _read(self, source: IO[bytes], size: int, where: str, done: int, total: int) -> bytes:
        """The next bytes of the stream; PeerUnavailableError (not the disk's OSError) when it broke."""
        try:
            chunk = source.read(size)
        except OSError as err:
            chunk, why = b"", f": {err.strerror or err or type(err).__name__}"
        else:
            why = ""
        if not chunk:
            raise PeerUnavailableError(
                f"the checkpoint of epoch {self.epoch} from {where} broke off after {_mb(done)} of {_mb(total)}{why}"
            )
        return chunk

    def _header(self, source: IO[bytes], where: str, key: bytes) -> tuple[Manifest, list[int], int]:
        line = source.readline(MAX_HEADER + 1)
        if not line:
            raise PeerUnavailableError(
                f"the peer at {where} closed the connection without sending the checkpoint (it does not take this "
                "run's secret, or it is stopping)"
            )
        try:
            if len(line) > MAX_HEADER:
                raise ValueError(f"a header longer than {MAX_HEADER} bytes")
            header = json.loads(line)
            if not isinstance(header, dict):
                raise ValueError("not an object")
            if "error" in header:
                raise PeerUnavailableError(f"the peer at {where} cannot send it: {header['error']}")
            if not sealed(key, "header", header):
                raise ValueError("it is not sealed with the run's secret")
            manifest = Manifest.from_json(header["manifest"])
            sizes = [int(s) for s in header["sizes"]]
            offset = int(header["offset"])
            if len(sizes) != len(manifest.files) or min(sizes) < 0:
                raise ValueError(f"{len(sizes)} sizes for {len(manifest.files)} files")
        except (ValueError, KeyError, TypeError) as err:
            raise PeerUnavailableError(f"the checkpoint from {where} has no valid header: {err}") from None
        if manifest.epoch != self.epoch:
            raise PeerUnavailableError(f"the peer at {where} sent epoch {manifest.epoch}, not {self.epoch}")
        if offset and (offset != self._prefix[0] or self._plan() != (list(manifest.files), sizes)):
            raise PeerUnavailableError(f"the peer at {where} resumes at byte {offset}, which this task did not ask")
        self._header_mac = header["mac"]
        return manifest, sizes, offset

    def _trailer(self, source: IO[bytes], where: str, key: bytes, digest: Any) -> None:
        try:
            trailer = json.loads(source.readline(MAX_LINE + 1))
        except (OSError, ValueError):
            trailer = {}
        if not isinstance(trailer, dict) or not trailer.get("sha256"):
            raise PeerUnavailableError(f"the checkpoint of epoch {self.epoch} from {where} ended without its trailer")
        expected = {"sha256": trailer["sha256"], "header": self._header_mac, "mac": trailer.get("mac")}
        if not (sealed(key, "trailer", expected) and trailer["sha256"] == digest.hexdigest()):
            shutil.rmtree(self.area, ignore_errors=True)
            raise PeerUnavailableError(f"the checkpoint of epoch {self.epoch} from {where} fails its checksum")

    def _install(self, manifest: Manifest) -> None:
        """Moves (or uploads) the verified files into the home, then records them there."""
        location = self.home._location
        for name in manifest.files:
            source = os.path.join(self.area, name)
            if location.is_object_store:
                target = location.path(name)
                location.call("write", target, lambda s=source, t=target: location.fs.put_file(s, t))
            else:
                os.replace(source, location.path(name))
        self.home.commit(manifest.epoch, manifest.epochs)
        shutil.rmtree(self.area, ignore_errors=True)

    def _check_space(self, needed: int, total: int, where: str) -> None:
        parent = self.area
        while not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        free = shutil.disk_usage(parent).free
        if free < needed:
            shutil.rmtree(self.area, ignore_errors=True)
            raise NoSpaceError(
                f"no space left on the disk of {self.home.uri} for the checkpoint of epoch {self.epoch} from "
                f"{where}: it needs {needed} bytes ({_mb(total)} in all), {free} are free; free space there or give "
                "the task a larger volume"
            )

    def _fault(self, err: OSError, where: str, total: int) -> Exception:
        """The contract's fault for a local write that failed; the area is removed (it may be what fills the disk)."""
        shutil.rmtree(self.area, ignore_errors=True)
        what = f"the disk of {self.home.uri} while receiving the checkpoint of epoch {self.epoch} from {where}"
        if err.errno == errno.ENOSPC:
            return NoSpaceError(
                f"no space left on {what}: it needs {total} bytes ({_mb(total)}), the disk filled after "
                f"{_mb(self.position)}; the partial copy is removed; free space there or give the task a larger volume"
            )
        if err.errno == errno.EDQUOT:
            return QuotaError(f"the disk quota is exceeded on {what}: it needs {total} bytes ({_mb(total)})")
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return DeniedError(f"{what}: {err.strerror} ({err.filename or self.area})")
        return StorageFaultError(f"{what}: {err.strerror or err}")

    def _progress(
        self, where: str, position: int, total: int, started: float, offset: int, finished: bool = False
    ) -> None:
        elapsed = max(time.monotonic() - started, 1e-6)
        rate = (position - offset) / elapsed / 1e6
        if finished:
            kept = f"; {_mb(offset)} of it kept from a broken transfer" if offset else ""
            log.info(
                "%s: received the checkpoint of epoch %d from %s: %s in %.1f s, %.1f MB/s%s",
                self.name,
                self.epoch,
                where,
                _mb(total - offset),
                elapsed,
                rate,
                kept,
            )
            return
        log.info(
            "%s: receiving the checkpoint of epoch %d from %s: %s of %s (%d%%), %.1f MB/s",
            self.name,
            self.epoch,
            where,
            _mb(position),
            _mb(total),
            100 * position // max(total, 1),
            rate,
        )


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _epoch_of(name: str) -> int | None:
    match = _CHECKPOINT_FILE.match(name)
    return int(match.group(1)) if match else None


def agree(own: int, peers: Mapping[str, int | None]) -> tuple[int, str | None]:
    """Where a cluster resumes: the latest epoch any task holds, and a peer to fetch it from when this task lacks it.

    Args:
        own: the epoch of this task's latest checkpoint (0: none).
        peers: each peer's control address and the epoch of its latest checkpoint (0 or None: none).

    Returns:
        (epoch, peer): the epoch every task resumes after (0: all start at epoch 1), and the address of a peer
        that holds it when `own` is older, else None.
    """
    target = max([own, *(e or 0 for e in peers.values())])
    if target == own:
        return target, None
    return target, next(address for address, e in peers.items() if (e or 0) == target)


# ROOT on a task's own disk, under its temporary directory: a pod's (lost with the pod), or this machine's.
OWN_DISK_DIR = "tfjob-checkpoints"


def root_of(checkpoint_dir: str, model_dir: str = "") -> str:
    """ROOT, the one default for every task.

    `checkpoint_dir` when set; else `MODEL_DIR.backup` beside the model directory the tasks share (`trainer-train`,
    `trainer-launch`, a local pipeline); else, without one (a pod's artifact, a user's command), a directory on the
    task's own disk (`OWN_DISK_DIR` under the temporary directory).
    """
    if checkpoint_dir.rstrip("/"):
        return checkpoint_dir.rstrip("/")
    if model_dir.rstrip("/"):
        return f"{model_dir.rstrip('/')}.backup"
    return os.path.join(tempfile.gettempdir(), OWN_DISK_DIR)


def checkpoint_root(config: Any) -> str:
    """ROOT of a training config: `root_of` its `checkpoint_dir` and `model_dir`."""
    return root_of(config.runtime.checkpoint_dir, config.runtime.model_dir)


def home_for(config: Any, tf_config: Mapping[str, Any] | None) -> CheckpointHome:
    """This task's home: `ROOT/<run key>/<task>`."""
    return CheckpointHome(f"{checkpoint_root(config)}/{run_key(config.runtime.run_id)}/{task_dir(tf_config)}")


def clean_leftovers(
    root: str, run_id: str, now: float, stale_after: float = STALE_AFTER_SECONDS, remove: bool = True
) -> list[str]:
    """Removes what other runs left under ROOT once nothing in it has been written for `stale_after` seconds.

    Only this project's own entries are touched: run directories (`r` + 10 hex digits) and task homes of the layout
    before run keys (`worker-0`, ...). A younger one may belong to a run still training and is kept (and logged).

    Args:
        root: ROOT, a path or `gs://` prefix.
        run_id: this run's id; its own directory is never touched.
        now: the current Unix time.
        stale_after: the age, in seconds since the last write, from which a leftover is removed.
        remove: False where the files are a user's command's (`$(CHECKPOINT_DIR)`): other runs' directories are
            only counted in one line, never removed.

    Returns:
        The names removed.
    """
    location = Location(root)
    own = run_key(run_id)
    removed, others = [], []
    for name in location.children():
        if name == own or not (is_run_key(name) or (remove and _TASK_DIR.match(name))):
            continue
        written = _last_written(location, name)
        age = now - written if written is not None else float("inf")
        if not remove:
            others.append(age)
        elif age < stale_after:
            log.info(
                "kept %s: another run's checkpoints, last written %.1f h ago (removed once %.0f h old)",
                location.uri_of(name),
                age / 3600,
                stale_after / 3600,
            )
        else:
            location.remove(name)
            removed.append(name)
            log.info(
                "removed %s: a finished or failed run's checkpoints, last written %s",
                location.uri_of(name),
                f"{age / 3600:.1f} h ago" if written is not None else "at an unknown time (it holds no file)",
            )
    if others:
        log.info(
            "%s holds %d other runs' CHECKPOINT_DIR (the oldest last written %.1f h ago); what commands write there "
            "is theirs and is never removed here: delete old ones yourself (a bucket lifecycle rule, a cron job)",
            location.uri,
            len(others),
            max(others) / 3600,
        )
    return removed


def clean_before_training(root: str, run_id: str, tf_config: Mapping[str, Any] | None, remove: bool = True) -> None:
    """The first task of a run (the chief, else worker 0) removes other runs' stale leftovers under ROOT.

    A store that cannot be listed leaves them, with a warning: this run's own training does not depend on it.
    With `remove` False (a command's `$(CHECKPOINT_DIR)`) they are only counted (`clean_leftovers`).
    """
    import time

    from trainer.cluster.topology import is_chief
    from trainer.core.errors import ServiceError

    if tf_config and not is_chief(tf_config):
        return
    try:
        clean_leftovers(root, run_id, time.time(), remove=remove)
    except (OSError, ServiceError) as err:
        log.warning("could not look for other runs' leftovers under %s: %s", root, err)


def _last_written(location: Location, name: str) -> float | None:
    """The newest modification time (Unix seconds) of any file under `name`, or None when it holds no file."""
    found = location.fs.find(location.path(name), detail=True)
    times = [t for info in found.values() if (t := _modified(info)) is not None]
    return max(times) if times else None


def _modified(info: Mapping[str, Any]) -> float | None:
    """A file's modification time from fsspec's info: `mtime` (local), `updated` (gcsfs), `LastModified` (s3fs)."""
    import datetime

    value = info.get("mtime", info.get("updated", info.get("LastModified")))
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, str):
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None
