"""Object storage and volumes through fsspec: local paths, `s3://` (s3fs: MinIO, AWS) and `gs://` (gcsfs).

TensorFlow 2.21's `tf.io.gfile` has no `s3://` (tensorflow-io's plugin stops at TF 2.16), so what the trainer
publishes or shares outside TensorFlow goes through fsspec. Credentials come the way the libraries look for them:
`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` (a Kubernetes Secret as environment) for S3, Application Default
Credentials (workload identity, `GOOGLE_APPLICATION_CREDENTIALS`) for GCS.

Every operation goes through `Location.call`, which names each failure (`trainer.core.faults`):

- a refused call is one line naming the bucket, the key, the permission the credentials lack and the credentials
  (DeniedError, exit 4); a full disk or store is NoSpaceError (3), an exceeded quota QuotaError (5);
- a throttled or unavailable store (S3 503 SlowDown, 500 InternalError, GCS 429 and 5xx, a connection refused or
  reset) is retried with backoff and jitter, 5 attempts in all, then StoreUnavailableError (142, retryable). On S3
  these are the only retries: s3fs's own (5 on SlowDown) and botocore's (5 per request) are turned off, so a call
  makes at most 5 requests (a streamed write, which cannot be repeated from here, leaves them to the clients:
  `client_attempts`). gcsfs retries each request 6 times itself (1, 2, 4, 8, 16 s plus up to 1 s of jitter)
  and cannot be told otherwise per filesystem, so an error it has retried is not retried again: at most 6 requests;
  a transient error gcsfs does not retry (a 403 rate limit) gets the 5 attempts here;
- a bucket that does not exist is bad input (exit 2); anything else is StorageError (exit 1).

Listings are never cached (`use_listings_cache=False` on s3 and gs), so a listing after another writer's write
sees it: the checkpoint manifest names the files the store holds now.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.core import faults
from trainer.core.errors import DeniedError, ServiceError, UsageError
from trainer.core.files import json_bytes, write_json

T = TypeVar("T")

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


class StorageError(ServiceError):
    """Object storage failed a call in a way no other fault names (exit 1); the message names bucket and key."""


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
        client_attempts: requests botocore makes per S3 call (it retries 5xx, throttling and broken connections);
            1, so that `call` alone retries, except for an operation `call` cannot repeat (a streamed write's parts).
    """

    def __init__(self, uri: str, endpoint: str = "", refused: str = "", client_attempts: int = 1) -> None:
        import fsspec

        self.scheme = scheme_of(uri)
        self.uri = uri.rstrip("/")
        self.endpoint = endpoint
        self.refused = refused
        if self.scheme == "s3":
            options: dict[str, Any] = {
                "skip_instance_cache": True,
                "use_listings_cache": False,
                "config_kwargs": {"retries": {"mode": "standard", "total_max_attempts": client_attempts}},
            }
            if endpoint:
                options["endpoint_url"] = endpoint
            self.fs = fsspec.filesystem("s3", **options)
            self.fs.retries = client_attempts
        elif self.scheme == "gs":
            self.fs = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)
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

    def call(self, kind: str, key: str, operation: Callable[[], T], retry: bool = True) -> T:
        """`operation()`, one call of `kind` (list, read, write, delete) on `key`, under the storage fault rules.

        A transient fault is retried (`faults.retrying`; not with `retry` False: an operation that cannot be repeated,
        a part of a streamed write); every failure becomes one line naming it.

        Raises:
            DeniedError: the store or the file system refused the call (exit 4).
            NoSpaceError, QuotaError: no space left, or a quota exceeded (exit 3, 5).
            StoreUnavailableError: the store stayed throttled or unavailable through the retries (exit 142).
            UsageError: the bucket does not exist (exit 2).
            StorageError: the store failed the call otherwise (exit 1).
            FileNotFoundError: a local file the call reads is missing.
        """
        try:
            attempts = faults.ATTEMPTS if retry else 1
            return faults.retrying(
                operation, self._what(kind, key), attempts=attempts, client_retried=self._client_retried
            )
        except DeniedError as fault:
            refusal = fault.__cause__
            if self.is_object_store and refusal is not None and (_code(refusal) or _forbidden(refusal)):
                raise self._denied(refusal, kind, key) from None
            raise
        except (UsageError, ServiceError):
            raise
        except FileNotFoundError as err:
            if self.is_object_store and _code(err) == "NoSuchBucket":
                raise UsageError(
                    f"bucket {self.bucket!r} of {self.uri} does not exist{self._at()}; create it first"
                ) from None
            raise
        except Exception as err:  # noqa: BLE001 - every library error becomes the contract's ServiceError
            if not self.is_object_store:
                raise
            detail = " ".join(str(err).split())[:200] or type(err).__name__
            raise StorageError(f"{self._what(kind, key)} failed: {detail}") from None

    def _at(self) -> str:
        return f" at {self.endpoint}" if self.endpoint else ""

    def _what(self, kind: str, key: str) -> str:
        if self.is_object_store:
            return f"{self.scheme}://{self.bucket}{self._at()}: {kind} {key!r}"
        return f"{kind} {key!r}"

    def _client_retried(self, err: BaseException) -> bool:
        """Whether gcsfs has retried `err` itself (6 attempts per request), so it is not retried again here."""
        if self.scheme != "gs":
            return False
        from gcsfs.retry import is_retriable

        return any(is_retriable(cause) for cause in (err, err.__cause__) if cause is not None)

    def _denied(self, err: BaseException, kind: str, key: str) -> DeniedError:
        """The refusal's line: bucket, key, what the credentials lack, and which credentials."""
        code = _code(err) or ("403" if _forbidden(err) else "")
        permission = PERMISSIONS[self.scheme][kind]
        why = "access denied"
        if self.scheme == "s3":
            why = {
                "InvalidAccessKeyId": "the access key is not known to this server",
                "SignatureDoesNotMatch": "the secret key does not match the access key",
                "403": "access denied (an unknown access key, a wrong secret key or a missing permission)",
            }.get(code, why)
        need = self.refused or f"need {permission} on bucket {self.bucket!r}"
        return DeniedError(
            f"{self.scheme}://{self.bucket}{self._at()} refused to {kind} {key!r}: {why} "
            f"({code or type(err).__name__}); the credentials ({_CREDENTIALS[self.scheme]}) {need}"
        )

    # --- operations ------------------------------------------------------------------------------------------

    def exists(self, *parts: str) -> bool:
        """Whether `parts` exists under this location."""
        key = self.path(*parts)
        return self.call("list", key, lambda: self.fs.exists(key))

    def read_json(self, *parts: str) -> Any | None:
        """The JSON document at `parts`, or None when there is none."""
        key = self.path(*parts)

        def read() -> bytes | None:
            try:
                return self.fs.cat_file(key)
            except FileNotFoundError as err:
                if _code(err) == "NoSuchBucket":
                    raise
                return None

        data = self.call("read", key, read)
        return None if data is None else json.loads(data)

    def write_json(self, data: Any, *parts: str) -> None:
        """Replaces the document at `parts` whole: one PUT on object storage, write-then-rename on a path."""
        key = self.path(*parts)
        if self.is_object_store:
            self.call("write", key, lambda: self.fs.pipe_file(key, json_bytes(data)))
        else:
            self.call("write", key, lambda: write_json(key, data))

    def children(self) -> list[str]:
        """The names directly under this location (none when it does not exist yet)."""

        def names() -> list[str]:
            try:
                entries = self.fs.ls(self.root, detail=False)
            except FileNotFoundError as err:
                if _code(err) == "NoSuchBucket":
                    raise
                return []
            return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

        return self.call("list", self.root, names)

    def files(self, *parts: str) -> list[str]:
        """Every file under `parts`, relative to it, sorted."""
        base = self.path(*parts)
        found = self.call("list", base, lambda: self.fs.find(base))
        return sorted(f[len(base) + 1 :] for f in found if f != base)

    def upload(self, local_dir: str, *parts: str) -> None:
        """Copies the files of a local directory to `parts` (each file one call, retried on its own)."""
        for root, _, names in os.walk(local_dir):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), local_dir)
                key = self.path(*parts, rel.replace(os.sep, "/"))
                source = os.path.join(root, name)
                self.call("write", key, lambda source=source, key=key: self.fs.put_file(source, key))

    def copy(self, source: str, target: str) -> None:
        """A server-side copy of one object (a file copy on a path)."""
        self.call("write", target, lambda: self.fs.copy(source, target))

    def rename_dir(self, source: str, target: str) -> None:
        """Renames a directory on a path (atomic on one file system)."""
        self.call("write", target, lambda: os.rename(source, target))

    def remove(self, *parts: str) -> None:
        """Removes everything under `parts`; what is already gone is fine."""
        key = self.path(*parts)

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(key, recursive=True)

        self.call("delete", key, remove)


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


def _forbidden(err: BaseException) -> bool:
    """Whether `err` is gcsfs's form of a GCS 403 (an OSError "Forbidden: URL\nMESSAGE")."""
    return type(err) is OSError and str(err).startswith("Forbidden: ")
