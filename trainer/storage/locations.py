"""Object storage and volumes through fsspec: local paths, `s3://` (s3fs: MinIO, AWS) and `gs://` (gcsfs).

TensorFlow 2.21's `tf.io.gfile` has no `s3://` (tensorflow-io's plugin stops at TF 2.16), so what the trainer
publishes or shares outside TensorFlow goes through fsspec. Credentials come the way the libraries look for them:
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (a Kubernetes Secret as environment) for S3, Application Default
Credentials (workload identity, `GOOGLE_APPLICATION_CREDENTIALS`) for GCS. A refused call becomes one line naming
the bucket, the key and the permission the credentials lack (`StorageError`, exit 1); a bucket that does not exist
is bad input (exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from trainer.core.errors import ServiceError, UsageError
from trainer.core.files import json_bytes, write_json

# What each kind of call needs, per scheme, in the words of the provider's policies.
PERMISSIONS = {
    "s3": {"list": "s3:ListBucket", "read": "s3:GetObject", "write": "s3:PutObject", "delete": "s3:DeleteObject"},
    "gs": {
        "list": "storage.objects.list",
        "read": "storage.objects.get",
        "write": "storage.objects.create",
        "delete": "storage.objects.delete",
    },
}
_CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
    "gs": "the pod's Google service account (workload identity or GOOGLE_APPLICATION_CREDENTIALS)",
}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "401", "Forbidden"}


class StorageError(ServiceError):
    """Object storage refused a call or could not be reached; the message names bucket, key and permission."""


def scheme_of(uri: str) -> str:
    """`s3`, `gs`, or `` for a local path (also `file://`)."""
    head, sep, _ = uri.partition("://")
    return head.lower() if sep and head.lower() != "file" else ""


class Location:
    """A directory under a local path or a bucket prefix, with the operations publishing and status need.

    Args:
        uri: a path, `file://PATH`, `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`.
        endpoint: the S3 endpoint URL (SeaweedFS, MinIO); empty: AWS, or whatever `$AWS_ENDPOINT_URL_S3` says.
        refused: what to add to the line when the store refuses a call (where these credentials may write).
    """

    def __init__(self, uri: str, endpoint: str = "", refused: str = "") -> None:
        import fsspec

        self.scheme = scheme_of(uri)
        self.uri = uri.rstrip("/")
        self.endpoint = endpoint
        self.refused = refused
        if self.scheme == "s3":
            options: dict[str, Any] = {"skip_instance_cache": True, "use_listings_cache": False}
            if endpoint:
                options["endpoint_url"] = endpoint
            self.fs = fsspec.filesystem("s3", **options)
        elif self.scheme == "gs":
            self.fs = fsspec.filesystem("gs", skip_instance_cache=True)
        elif self.scheme:
            raise UsageError(
                f"{uri!r} is not allowed; allowed: a local or volume path, s3://BUCKET/..., gs://BUCKET/..."
            )
        else:
            self.fs = fsspec.filesystem("file", auto_mkdir=True)
        self.root = (
            self.fs._strip_protocol(self.uri) if self.scheme else os.path.abspath(self.uri.removeprefix("file://"))
        )
        self.bucket = self.root.split("/")[0] if self.scheme else ""

    @property
    def is_object_store(self) -> bool:
        """Whether this is a bucket (no rename, whole-object writes) rather than a path."""
        return bool(self.scheme)

    def path(self, *parts: str) -> str:
        """The filesystem path of `parts` under this location."""
        return "/".join([self.root, *parts])

    def uri_of(self, *parts: str) -> str:
        """The URI of `parts` under this location, as users write it."""
        return "/".join([self.uri, *parts])

    @contextlib.contextmanager
    def call(self, kind: str, key: str) -> Iterator[None]:
        """Turns a refused or failed call of `kind` (list, read, write, delete) on `key` into one clear line."""
        try:
            yield
        except (UsageError, ServiceError):
            raise
        except FileNotFoundError as err:
            if self.is_object_store and _code(err) == "NoSuchBucket":
                raise UsageError(
                    f"bucket {self.bucket!r} of {self.uri} does not exist{self._at()}; create it first"
                ) from None
            raise
        except Exception as err:  # noqa: BLE001 - every library error becomes the contract's ServiceError
            raise self._explain(err, kind, key) from None

    def _at(self) -> str:
        return f" at {self.endpoint}" if self.endpoint else ""

    def _explain(self, err: BaseException, kind: str, key: str) -> BaseException:
        if not self.is_object_store:
            return err
        code = _code(err)
        permission = PERMISSIONS[self.scheme][kind]
        where = f"{self.scheme}://{self.bucket}"
        if isinstance(err, PermissionError) or code in _DENIED:
            why = {
                "InvalidAccessKeyId": "the access key is not known to this server",
                "SignatureDoesNotMatch": "the secret key does not match the access key",
                "403": "access denied (an unknown access key, a wrong secret key or a missing permission)",
            }.get(code, "access denied")
            need = self.refused or f"need {permission} on bucket {self.bucket!r}"
            return StorageError(
                f"{where}{self._at()} refused to {kind} {key!r}: {why} ({code or type(err).__name__}); the "
                f"credentials ({_CREDENTIALS[self.scheme]}) {need}"
            )
        detail = " ".join(str(err).split())[:200] or type(err).__name__
        return StorageError(f"{where}{self._at()}: {kind} {key!r} failed: {detail}")

    # --- operations ------------------------------------------------------------------------------------------

    def exists(self, *parts: str) -> bool:
        """Whether `parts` exists under this location."""
        with self.call("list", self.path(*parts)):
            return self.fs.exists(self.path(*parts))

    def read_json(self, *parts: str) -> Any | None:
        """The JSON document at `parts`, or None when there is none."""
        key = self.path(*parts)
        with self.call("read", key):
            try:
                data = self.fs.cat_file(key)
            except FileNotFoundError as err:
                if _code(err) == "NoSuchBucket":
                    raise
                return None
        return json.loads(data)

    def write_json(self, data: Any, *parts: str) -> None:
        """Replaces the document at `parts` whole: one PUT on object storage, write-then-rename on a path."""
        key = self.path(*parts)
        with self.call("write", key):
            if self.is_object_store:
                self.fs.pipe_file(key, json_bytes(data))
            else:
                write_json(key, data)

    def children(self) -> list[str]:
        """The names directly under this location (none when it does not exist yet)."""
        with self.call("list", self.root):
            try:
                entries = self.fs.ls(self.root, detail=False)
            except FileNotFoundError as err:
                if _code(err) == "NoSuchBucket":
                    raise
                return []
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def files(self, *parts: str) -> list[str]:
        """Every file under `parts`, relative to it, sorted."""
        base = self.path(*parts)
        with self.call("list", base):
            found = self.fs.find(base)
        return sorted(f[len(base) + 1 :] for f in found if f != base)

    def upload(self, local_dir: str, *parts: str) -> None:
        """Copies the files of a local directory to `parts`."""
        for root, _, names in os.walk(local_dir):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), local_dir)
                key = self.path(*parts, rel.replace(os.sep, "/"))
                with self.call("write", key):
                    self.fs.put_file(os.path.join(root, name), key)

    def copy(self, source: str, target: str) -> None:
        """A server-side copy of one object (a file copy on a path)."""
        with self.call("write", target):
            self.fs.copy(source, target)

    def rename_dir(self, source: str, target: str) -> None:
        """Renames a directory on a path (atomic on one file system)."""
        os.rename(source, target)

    def remove(self, *parts: str) -> None:
        """Removes everything under `parts`; what is already gone is fine."""
        key = self.path(*parts)
        with self.call("delete", key):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(key, recursive=True)


def _code(err: BaseException) -> str:
    """The provider's error code behind an fsspec error (`AccessDenied`, `NoSuchBucket`, `403`), if any."""
    for cause in (err, err.__cause__, err.__context__):
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and "Error" in response:
            return str(response["Error"].get("Code", ""))
        code = getattr(cause, "code", None)
        if isinstance(code, int):
            return str(code)
    return ""
