"""Where a prepared dataset's shard files are: a local path (or a claim's mount), `gs://` or `s3://`.

    place = Place.of("s3://mlpipeline/private-artifacts/team/datasets/r3f2a", "http://seaweedfs.kubeflow:9000")
    with place.writer("train-00000-of-00004.tfrecord") as f: ...   # straight to the store (a multipart upload)
    place.native                                                    # False: TensorFlow 2.21 cannot open s3://

TensorFlow reads a local path and `gs://` itself (`tf.data.TFRecordDataset`); an `s3://` file is read through
fsspec in ranged requests of `READ_BYTES` (`trainer.data.streamed`). Every call goes through
`trainer.storage.locations.Location`, which names each failure (denied, no space, a store that stays unavailable).

A streamed write (`writer`) cannot be repeated from here once its first part is sent, so its parts are retried by
the store's own client: botocore and s3fs make up to `WRITE_ATTEMPTS` attempts of each S3 request (a part is
idempotent: the same part number is replaced), gcsfs retries its resumable upload's chunks; a fault that outlasts
them is named as any other, with no retry here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from trainer.storage.locations import Location, scheme_of

# Bytes per ranged read of a streamed file, and per part of a streamed write (S3 parts are at least 5 MiB).
READ_BYTES = 2 << 20
WRITE_BYTES = 8 << 20
WRITE_ATTEMPTS = 5
# What this process has read through `read_range`: bytes in all, and per file the furthest byte read (the training
# log reports both per epoch).
_READ = [0]
_FURTHEST: dict[str, int] = {}
# The file system of each place this process reads (an S3 client is a session and a connection pool: made once).
_LOCATIONS: dict[tuple[str, str, bool], Location] = {}


@dataclasses.dataclass(frozen=True)
class Place:
    """A directory of shard files, and the S3 endpoint when it is on one (empty: AWS or `$AWS_ENDPOINT_URL_S3`)."""

    base: str
    endpoint: str = ""

    @classmethod
    def of(cls, base: str, endpoint: str = "") -> Place:
        """The place `base` (a path, `file://`, `s3://` or `gs://`), refusing another scheme (UsageError)."""
        place = cls(base.rstrip("/"), endpoint if scheme_of(base) == "s3" else "")
        place.location()
        return place

    @property
    def scheme(self) -> str:
        """`s3`, `gs`, or `` for a path."""
        return scheme_of(self.base)

    @property
    def native(self) -> bool:
        """Whether TensorFlow's own file systems open it (a path, `gs://`); `s3://` is read through fsspec."""
        return self.scheme != "s3"

    def uri(self, name: str) -> str:
        """The URI (or path) of file `name` here."""
        return f"{self.base}/{name}"

    def location(self, writing: bool = False) -> Location:
        """This place as a `Location` (its file system, its fault rules), made once per process.

        `writing`: the one whose S3 client retries each part of a streamed write itself (see the module docstring).
        """
        key = (self.base, self.endpoint, writing)
        if key not in _LOCATIONS:
            _LOCATIONS[key] = Location(self.base, self.endpoint, client_attempts=WRITE_ATTEMPTS if writing else 1)
        return _LOCATIONS[key]

    @contextlib.contextmanager
    def writer(self, name: str) -> Iterator[BinaryIO]:
        """File `name` open for writing from its first byte; it exists whole once the block ends without error."""
        location = self.location(writing=True)
        key = location.path(name)
        options = {"block_size": WRITE_BYTES} if location.is_object_store else {}
        handle = location.call("write", key, lambda: location.fs.open(key, "wb", **options))
        try:
            yield _Named(handle, location, key)
            location.call("write", key, handle.close, retry=False)
        except BaseException:
            _abandon(handle)
            raise

    def size(self, name: str) -> int:
        """The bytes of file `name`."""
        location = self.location()
        key = location.path(name)
        return int(location.call("list", key, lambda: location.fs.size(key)))

    def exists(self, name: str) -> bool:
        """Whether file `name` is here."""
        return self.location().exists(name)

    def read_range(self, name: str, start: int, end: int, location: Location | None = None) -> bytes:
        """Bytes `start` to `end` (exclusive) of file `name`: one ranged request on a store, retried as a read."""
        location = location or self.location()
        key = location.path(name)
        data = location.call("read", key, lambda: location.fs.cat_file(key, start=start, end=end))
        _READ[0] += len(data)
        _FURTHEST[key] = max(_FURTHEST.get(key, 0), start + len(data))
        return data

    def chunks(self, name: str, chunk_bytes: int = READ_BYTES) -> Iterator[bytes]:
        """File `name` from its first byte to its last, in ranged reads of `chunk_bytes`."""
        location = self.location()
        total = self.size(name)
        for start in range(0, total, chunk_bytes):
            yield self.read_range(name, start, min(total, start + chunk_bytes), location)

    def sha256(self, name: str) -> str:
        """The SHA-256 hex digest of file `name`."""
        digest = hashlib.sha256()
        for chunk in self.chunks(name):
            digest.update(chunk)
        return digest.hexdigest()

    def clear(self) -> None:
        """Removes everything here (what is already gone is fine)."""
        self.location().remove()


def _abandon(handle: Any) -> None:
    """Ends a write that failed without completing it: a store's multipart upload is aborted, a file closed."""
    with contextlib.suppress(Exception):
        if hasattr(handle, "discard"):
            handle.discard()
            handle.closed = True  # else fsspec completes the upload it has just aborted when the object is collected
        else:
            handle.close()


def bytes_read() -> tuple[int, int, int]:
    """What this process has read from places through ranged reads (checksums and streamed records).

    Returns:
        The bytes read in all, the bytes of the files read counted once (each file from its start to the furthest
        byte read), and how many files.
    """
    return _READ[0], sum(_FURTHEST.values()), len(_FURTHEST)


class _Named:
    """A file being written whose failures are named as the store's faults (`Location.call`), without retrying."""

    def __init__(self, handle: Any, location: Location, key: str) -> None:
        self._handle, self._location, self._key = handle, location, key

    def write(self, data: bytes) -> int:
        """Appends `data` (on a store, a full part is sent as it fills)."""
        return self._location.call("write", self._key, lambda: self._handle.write(data), retry=False)
