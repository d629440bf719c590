"""Conditional writes on a path, S3 and GCS: create a name only if it is free, replace a document only if unchanged.

Publishing (`trainer.publishing.publish`) claims its version number with `create` and moves `latest.json` on with
`replace`, so that concurrent publishers to one location never share a number and never overwrite each other's
`latest.json` unseen. What each store offers:

| store | create (exclusive)                              | replace (compare-and-swap)                          |
| ----- | ----------------------------------------------- | --------------------------------------------------- |
| path  | `open(O_CREAT | O_EXCL)`                        | `flock` on `.NAME.lock` beside it, compare, rename  |
| S3    | PutObject `If-None-Match: *` (412 when taken)   | PutObject `If-Match: <ETag>` (`If-None-Match: *`    |
|       |                                                 | when there is none yet)                             |
| GCS   | upload with `ifGenerationMatch=0`               | upload with `ifGenerationMatch=<generation>`        |

Not every S3 server honours those headers: AWS since 2024, MinIO, SeaweedFS from 3.97 (atomically under
concurrency only from 4.18; older releases ignore them and overwrite). So the first conditional call on an S3
location probes: it creates a probe object twice with `If-None-Match: *` and replaces it with a wrong `If-Match`;
both must be refused with 412. A server that accepts either, or answers 400 or 501 to the headers, is used without
conditions: `create` checks, writes and reads back, `replace` compares, writes and reads back, and a warning says
so. That does not exclude two writers: both can read "absent" (or the same ETag), both write, and each read back
its own write before the other's lands. `trainer.publishing.publish` copes with that as far as it can (version
numbers with a random part, checks after promoting and after replacing latest.json) and says what is left.

A conditional write whose response was lost is retried by the store's client (or `Location.call`) and then
refused by the store's own first success; `create` therefore counts a refusal as its own when the object holds
exactly what it wrote, and callers of `replace` recognise their own document on the next read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import uuid
from dataclasses import dataclass

from trainer.core.files import write_bytes
from trainer.storage.locations import Location

log = logging.getLogger(__name__)

PROBE = ".conditional-probe-"


@dataclass(frozen=True)
class Versioned:
    """A document as read, with what a conditional write needs to replace exactly this state of it.

    Attributes:
        data: its content; None when there is no document.
        token: the S3 ETag, the GCS generation, or on a path a digest of the content; empty when there is none.
    """

    data: bytes | None
    token: str = ""


class Store:
    """Conditional operations on one location (a path, an S3 prefix or a GCS prefix); see the module's table."""

    def __init__(self, target: Location) -> None:
        self.target = target

    @property
    def atomic(self) -> bool:
        """Whether the store excludes concurrent writers itself (False: writes are only read back, see above)."""
        return self._atomic()

    def create(self, data: bytes, *parts: str) -> bool:
        """Writes `data` at `parts` only if nothing is there; whether it did (or had already, a retried call)."""
        return self._create(self.target.path(*parts), data)

    def read(self, *parts: str) -> Versioned:
        """The document at `parts` and its token (data None when there is none)."""
        return self._read(self.target.path(*parts))

    def replace(self, data: bytes, expected: Versioned, *parts: str) -> bool:
        """Writes `data` at `parts` only if the document is still `expected` (absent, when its data is None).

        Returns:
            Whether it wrote; False when another writer changed (or created) the document since `expected`.
        """
        return self._replace(self.target.path(*parts), data, expected)

    def delete(self, *parts: str) -> None:
        """Removes the object or file at `parts`; what is already gone is fine."""
        self._delete(self.target.path(*parts))

    def _atomic(self) -> bool:
        return True

    def _create(self, key: str, data: bytes) -> bool:
        raise NotImplementedError

    def _read(self, key: str) -> Versioned:
        raise NotImplementedError

    def _replace(self, key: str, data: bytes, expected: Versioned) -> bool:
        raise NotImplementedError

    def _delete(self, key: str) -> None:
        raise NotImplementedError


def for_location(target: Location) -> Store:
    """The conditional operations of `target`'s store."""
    if target.scheme == "s3":
        return S3Store(target)
    if target.scheme == "gs":
        return GcsStore(target)
    return PathStore(target)


class PathStore(Store):
    """A local or mounted path: O_EXCL creates; a `flock`ed compare, then write-then-rename, replaces."""

    def _create(self, key: str, data: bytes) -> bool:
        def create() -> bool:
            os.makedirs(os.path.dirname(key), exist_ok=True)
            try:
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True

        return self.target.call("write", key, create)

    def _read(self, key: str) -> Versioned:
        return self.target.call("read", key, lambda: _read_file(key))

    def _replace(self, key: str, data: bytes, expected: Versioned) -> bool:
        lock = os.path.join(os.path.dirname(key), f".{os.path.basename(key)}.lock")

        def replace() -> bool:
            os.makedirs(os.path.dirname(key), exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if _read_file(key).token != expected.token:
                    return False
                write_bytes(key, data)
                return True
            finally:
                os.close(fd)

        return self.target.call("write", key, replace)

    def _delete(self, key: str) -> None:
        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(key)

        self.target.call("delete", key, remove)


def _read_file(path: str) -> Versioned:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return Versioned(None)
    return Versioned(data, hashlib.sha256(data).hexdigest())


class S3Store(Store):
    """S3 through s3fs's client: `If-None-Match: *` and `If-Match: <ETag>` on PutObject, probed once."""

    def __init__(self, target: Location) -> None:
        super().__init__(target)
        self._probed: bool | None = None

    def _atomic(self) -> bool:
        if self._probed is None:
            self._probed = self._probe()
            if not self._probed:
                log.warning(
                    "s3://%s%s ignores conditional writes (If-None-Match / If-Match on PutObject): writes to %s are "
                    "only read back, which does not exclude two runs publishing at the same moment; each run's "
                    "version number gets a random part and is checked after promotion, and latest.json is checked "
                    "after it is replaced, but two runs that draw the same number in the same second, or a write "
                    "delayed past the other run's checks, can still leave a version mixing two models or "
                    "latest.json naming the worse one; use a store that honours them (AWS S3, MinIO, SeaweedFS 4.18 "
                    "or later)",
                    self.target.bucket,
                    f" at {self.target.endpoint}" if self.target.endpoint else "",
                    self.target.uri,
                )
        return self._probed

    def _split(self, key: str) -> tuple[str, str]:
        bucket, name, _ = self.target.fs.split_path(key)
        return bucket, name

    def _put(self, key: str, data: bytes, **condition: str) -> bool:
        """One PutObject with `condition`; False when the store refused it as a failed precondition."""
        bucket, name = self._split(key)

        def put() -> bool:
            try:
                self.target.fs.call_s3("put_object", Bucket=bucket, Key=name, Body=data, **condition)
            except Exception as err:
                if condition and _refused_precondition(err):
                    return False
                raise
            return True

        return self.target.call("write", key, put)

    def _read(self, key: str) -> Versioned:
        from fsspec.asyn import sync

        bucket, name = self._split(key)
        fs = self.target.fs

        async def get() -> Versioned:
            try:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=name)
            except FileNotFoundError as err:
                if _s3_code(err) == "NoSuchBucket":
                    raise
                return Versioned(None)
            try:
                data = await response["Body"].read()
            finally:
                response["Body"].close()
            return Versioned(data, str(response.get("ETag", "")))

        return self.target.call("read", key, lambda: sync(fs.loop, get))

    def _probe(self) -> bool:
        """Whether the server refuses a second `If-None-Match: *` create and a wrong `If-Match` (412 both).

        A first create answered 400 or 501 (a server that rejects the header rather than ignoring it) means no.
        """
        key = self.target.path(f"{PROBE}{uuid.uuid4().hex}")
        try:
            try:
                created = self._put(key, b"1", IfNoneMatch="*")
            except Exception as err:
                if not _rejects_header(err):
                    raise
                log.info("%s answered a create with If-None-Match: * with %s", self.target.uri, _status_of(err))
                return False
            if not created:
                return False
            return self._refuses(key, IfNoneMatch="*") and self._refuses(key, IfMatch='"' + "0" * 32 + '"')
        finally:
            try:
                self._delete(key)
            except Exception as err:  # noqa: BLE001 - what the probe found is what counts
                log.warning("could not remove the probe object %s: %s", key, err)

    def _refuses(self, key: str, **condition: str) -> bool:
        try:
            return not self._put(key, b"2", **condition)
        except Exception as err:  # noqa: BLE001 - a server that rejects the header outright lacks it
            log.debug("%s refused outright: %s", condition, err)
            return False

    def _create(self, key: str, data: bytes) -> bool:
        if self.atomic:
            return self._put(key, data, IfNoneMatch="*") or self._read(key).data == data
        found = self._read(key).data
        if found is None:
            self._put(key, data)
            found = self._read(key).data
        return found == data

    def _replace(self, key: str, data: bytes, expected: Versioned) -> bool:
        if self.atomic:
            condition = {"IfMatch": expected.token} if expected.data is not None else {"IfNoneMatch": "*"}
            return self._put(key, data, **condition)
        if self._read(key).token != expected.token:
            return False
        self._put(key, data)
        return self._read(key).data == data

    def _delete(self, key: str) -> None:
        bucket, name = self._split(key)
        self.target.call("delete", key, lambda: self.target.fs.call_s3("delete_object", Bucket=bucket, Key=name))


def _s3_code(err: BaseException) -> str:
    for cause in (err, err.__cause__, err.__context__):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and "Error" in response:
            return str(response["Error"].get("Code", ""))
    return ""


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions behind it (causes and contexts), each once."""
    found: list[BaseException] = []
    pending: list[BaseException | None] = [err]
    while pending:
        cause = pending.pop()
        if cause is None or any(cause is seen for seen in found):
            continue
        found.append(cause)
        pending += [cause.__cause__, cause.__context__]
    return found


def _status_of(err: BaseException) -> str:
    """The HTTP status and S3 error code behind `err` (`501 NotImplemented`), as far as they are known."""
    for cause in _chain(err):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", "")
            return f"{status} {response.get('Error', {}).get('Code', '')}".strip()
    return type(err).__name__


def _rejects_header(err: BaseException) -> bool:
    """Whether a conditional PutObject failed with 400 or 501: the server does not take the header."""
    for cause in _chain(err):
        response = getattr(cause, "response", None)
        if not isinstance(response, dict):
            continue
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = str(response.get("Error", {}).get("Code", ""))
        if status in (400, 501) or code in ("NotImplemented", "InvalidArgument", "InvalidRequest", "BadRequest"):
            return True
    return False


def _refused_precondition(err: BaseException) -> bool:
    """A 412 (PreconditionFailed), a 409 (ConditionalRequestConflict) or, for `If-Match`, a 404: the object is gone."""
    if isinstance(err, FileExistsError) or _s3_code(err) in ("PreconditionFailed", "ConditionalRequestConflict"):
        return True
    if _s3_code(err) == "NoSuchKey":
        return True
    for cause in (err, err.__cause__, err.__context__):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            return True
    return False


class GcsStore(Store):
    """GCS's JSON API through gcsfs: uploads with `ifGenerationMatch` (0: only if absent), reads by generation."""

    def _split(self, key: str) -> tuple[str, str]:
        bucket, name, _ = self.target.fs.split_path(key)
        return bucket, name

    def _upload(self, key: str, data: bytes, generation: str) -> bool:
        """A media upload that succeeds only if the object's generation is `generation` ("0": it does not exist)."""
        from urllib.parse import quote

        bucket, name = self._split(key)
        fs = self.target.fs
        url = f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o"

        def upload() -> bool:
            try:
                fs.call(
                    "POST",
                    url,
                    uploadType="media",
                    name=name,
                    ifGenerationMatch=generation,
                    headers={"Content-Type": "application/json"},
                    data=data,
                    json_out=True,
                )
            except FileExistsError:  # gcsfs's word for 412 Precondition Failed
                return False
            return True

        return self.target.call("write", key, upload)

    def _create(self, key: str, data: bytes) -> bool:
        return self._upload(key, data, "0") or self._read(key).data == data

    def _read(self, key: str) -> Versioned:
        bucket, name = self._split(key)
        fs = self.target.fs

        def read() -> Versioned:
            for _ in range(10):
                try:
                    described = fs.call("GET", "b/{}/o/{}", bucket, name, json_out=True)
                except FileNotFoundError:
                    return Versioned(None)
                generation = str(described["generation"])
                try:
                    _, data = fs.call("GET", "b/{}/o/{}", bucket, name, alt="media", generation=generation)
                except FileNotFoundError:
                    continue  # replaced between the two requests: read the new generation
                return Versioned(data, generation)
            raise OSError(errno.EAGAIN, f"gs://{key} was replaced 10 times while it was read")

        return self.target.call("read", key, read)

    def _replace(self, key: str, data: bytes, expected: Versioned) -> bool:
        return self._upload(key, data, expected.token if expected.data is not None else "0")

    def _delete(self, key: str) -> None:
        bucket, name = self._split(key)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.target.fs.call("DELETE", "b/{}/o/{}", bucket, name)

        self.target.call("delete", key, remove)
