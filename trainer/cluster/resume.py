"""Where a training task keeps its latest epoch checkpoint, and how a task without one gets a peer's copy.

Every worker of a MultiWorkerMirroredStrategy cluster holds the same variables, so each keeps its own copy of the
latest checkpoint in its *home*, `ROOT/<task>` (for example `/tmp/tf-checkpoints/r1a2b3c4d5/worker-1`):

    ROOT/worker-1/ckpt-3.index, ckpt-3.data-00000-of-00001   TensorFlow's checkpoint after epoch 3
    ROOT/worker-1/resume.json   {"epoch": 3, "prefix": "ckpt-3", "files": [...], "epochs": [per-epoch results]}

The manifest is replaced whole after TensorFlow has written the checkpoint, so it only ever names a complete one.
Before every (re)start of a cluster the workers' supervisors agree on where to resume: the latest epoch any of
them holds (`agree`). A task that lacks it (a replaced pod starts with an empty disk) receives it from a peer that
has it over the run's control channel (`send` / `receive`), so all resume from the same epoch. When no task has
one, all start again from epoch 1. ROOT is `checkpoint_dir` (a volume or `gs://` keeps it when a pod is lost),
else a directory inside the pod. No TensorFlow here: the supervisor uses it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import IO, Any

from trainer.core.errors import PeerUnavailableError
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

MANIFEST = "resume.json"
CHUNK = 1 << 20
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
    task = tf_config["task"] if tf_config else {"type": "worker", "index": 0}
    return f"{task['type']}-{task['index']}"


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
        """Removes the home and everything in it (after a successful run); with `remove_root`, its root if empty."""
        self._location.remove()
        if remove_root and not self._location.is_object_store:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(self._location.root))

    def send(self, epoch: int, out: IO[bytes]) -> None:
        """Writes the checkpoint of `epoch` to `out`: a JSON header line, each file's bytes, a JSON trailer line.

        Raises:
            FileNotFoundError: this home holds no checkpoint of `epoch`.
        """
        manifest = self.latest()
        if manifest is None or manifest.epoch != epoch:
            raise FileNotFoundError(f"{self.uri} holds no checkpoint of epoch {epoch}")
        sizes = [self._location.fs.size(self._location.path(name)) for name in manifest.files]
        header = {"manifest": manifest.to_json(), "sizes": sizes}
        out.write(json.dumps(header).encode() + b"\n")
        digests = []
        for name in manifest.files:
            digest = hashlib.sha256()
            with self._location.fs.open(self._location.path(name), "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            digests.append(digest.hexdigest())
        out.write(json.dumps({"sha256": digests}).encode() + b"\n")
        out.flush()

    def receive(self, source: IO[bytes], where: str) -> Manifest:
        """Reads what `send` wrote, checks every byte, and makes it this home's latest checkpoint.

        Raises:
            PeerUnavailableError: the stream ended early or does not match its checksums (`where` names the peer).
        """
        try:
            header = json.loads(source.readline())
            if "error" in header:
                raise PeerUnavailableError(f"the peer at {where} cannot send it: {header['error']}")
            manifest = Manifest.from_json(header["manifest"])
            sizes = [int(s) for s in header["sizes"]]
            if len(sizes) != len(manifest.files) or min(sizes) < 0:
                raise ValueError(f"{len(sizes)} sizes for {len(manifest.files)} files")
        except (ValueError, KeyError, TypeError) as err:
            raise PeerUnavailableError(f"the checkpoint from {where} has no valid header: {err}") from None
        digests = []
        for name, size in zip(manifest.files, sizes, strict=True):
            digest = hashlib.sha256()
            with self._location.fs.open(self._location.path(name), "wb") as f:
                left = size
                while left:
                    chunk = source.read(min(CHUNK, left))
                    if not chunk:
                        raise PeerUnavailableError(
                            f"the checkpoint of epoch {manifest.epoch} from {where} ended after "
                            f"{size - left} of {size} bytes of {name}"
                        )
                    digest.update(chunk)
                    f.write(chunk)
                    left -= len(chunk)
            digests.append(digest.hexdigest())
        try:
            trailer = json.loads(source.readline())
        except ValueError:
            trailer = {}
        if trailer.get("sha256") != digests:
            raise PeerUnavailableError(f"the checkpoint of epoch {manifest.epoch} from {where} fails its checksums")
        return self.commit(manifest.epoch, manifest.epochs)


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


def home_for(config: Any, tf_config: Mapping[str, Any] | None) -> CheckpointHome:
    """This task's home: `ROOT/<task>`, ROOT being `checkpoint_dir`, else `MODEL_DIR.backup`."""
    root = config.runtime.checkpoint_dir or f"{config.runtime.model_dir.rstrip('/')}.backup"
    return CheckpointHome(f"{root.rstrip('/')}/{task_dir(tf_config)}")
