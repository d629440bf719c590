"""Storage faults named for what they are, and bounded retries of the transient ones.

`classify` turns an error of a disk, a volume or a store (OSError, botocore/s3fs, gcsfs, TensorFlow's file
errors) into the exit-code contract's fault (`trainer.core.errors`), each with one line naming the fault, where it
happened and what to do:

| what failed                                                                       | fault                  | exit |
| --------------------------------------------------------------------------------- | ---------------------- | ---- |
| ENOSPC; S3 507 / XMinioStorageFull; TF's "No space left on device"                | NoSpaceError           | 3    |
| EACCES, EPERM, EROFS; S3 AccessDenied, InvalidAccessKeyId, SignatureDoesNotMatch, | DeniedError            | 4    |
| 401/403; GCS 401/403 (other than quota); refused Google credentials               |                        |      |
| EDQUOT; S3 codes naming a quota; GCS 403 quotaExceeded / storageQuotaExceeded     | QuotaError             | 5    |
| S3 503 SlowDown, 500 InternalError, 502/504, throttling; GCS 408/429/5xx;         | StoreUnavailableError  | 142  |
| connections refused, reset or timed out; with `store_operation`: TF's             | (transient: retried)   |      |
| `UnavailableError`, `DeadlineExceededError`, "All N retry attempts failed"        |                        |      |

TensorFlow's `ResourceExhaustedError` is no fault of a store by its type alone: TensorFlow raises it for a full
disk (its message says "No space left on device", matched above) but also for memory ("OOM when allocating
tensor"), open files (EMFILE, ENFILE) and buffers (ENOBUFS), which are None here. TensorFlow's `UnavailableError`,
`DeadlineExceededError` and `AbortedError` mean a lost peer during training (`trainer.training.mirrored`); only a
caller whose operation is a write or read of a store through TensorFlow (the epoch checkpoint's write) passes
`store_operation`, which makes them the store's: its gs:// client retries a 503, 429 or a timeout itself and then
raises `AbortedError: All 10 retry attempts failed. The last failure: ...`.

`retrying` runs an operation and retries a transient fault with exponential backoff and jitter: `ATTEMPTS`
attempts in all, waiting a random time between half and all of 1, 2, 4, 8 s (`FIRST_DELAY` doubling, at most
`MAX_DELAY`) between them, so 7.5 to 15 s of waiting before it gives up with StoreUnavailableError. Every retry is
logged. An error the store's own client has already retried (`client_retried`) is not retried again.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from trainer.core.errors import DeniedError, NoSpaceError, QuotaError, StorageFaultError, StoreUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

ATTEMPTS = 5
FIRST_DELAY = 1.0
MAX_DELAY = 8.0

_S3_DENIED = {
    "AccessDenied",
    "AllAccessDisabled",
    "ExpiredToken",
    "Forbidden",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "401",
    "403",
}
_S3_NO_SPACE = {"XMinioStorageFull", "InsufficientStorage", "507"}
_S3_TRANSIENT = {
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestThrottled",
    "500",
    "502",
    "503",
    "504",
    "429",
}
_HTTP_TRANSIENT = {408, 429, 500, 502, 503, 504}
_TRANSIENT_TYPES = {
    ("botocore.exceptions", "HTTPClientError"),
    ("botocore.exceptions", "ConnectionError"),
    ("botocore.exceptions", "ResponseParserError"),
    ("aiohttp.client_exceptions", "ClientConnectionError"),
    ("aiohttp.client_exceptions", "ClientPayloadError"),
    ("requests.exceptions", "ConnectionError"),
    ("requests.exceptions", "Timeout"),
    ("requests.exceptions", "ChunkedEncodingError"),
    ("http.client", "IncompleteRead"),
    ("fsspec.exceptions", "FSTimeoutError"),
}

# What TensorFlow's errors of a lost peer say (its collectives, its coordination service's heartbeats).
_PEER_SIGNS = ("collective", "coordination service", "heartbeat")

_NO_SPACE_ADVICE = "free space there or give the task a larger volume"
_QUOTA_ADVICE = "raise the quota or remove old files or versions there"
_READ_ONLY_ADVICE = "mount it read-write or choose another location"
_TRANSIENT_ADVICE = (
    "the store is throttled or down: the task ends with 142 (a store fault that a training task's restart, a later "
    "run or a KFP retry of the run may not meet)"
)


def classify(err: BaseException, where: str, *, store_operation: bool = False) -> StorageFaultError | None:
    """The contract's fault for a failed store or disk operation, or None when `err` is not one of those.

    Args:
        err: what the operation raised (the provider's error may be its cause).
        where: what was being done to what, as the line starts: `writing '/data/x.json'`,
            `s3://models at http://minio:9000: write 'models/1/saved_model.pb'`.
        store_operation: `where` is an operation on a store through TensorFlow's file system and nothing else (a
            checkpoint's write): TensorFlow's UnavailableError and DeadlineExceededError, and the AbortedError its
            gs:// client raises once its own retries are spent, are then the store's (StoreUnavailableError).
            Elsewhere they may be a lost peer's and are None.

    Returns:
        NoSpaceError, DeniedError, QuotaError, or StoreUnavailableError for a transient fault (`retrying` retries
        those); None for anything else (a missing file, a bug), which callers raise as it is.
    """
    found = _fault(err)
    if found is None and store_operation:
        found = _tensorflow_transient(err)
    if found is None:
        return None
    kind, name, advice = found
    if isinstance(err, StorageFaultError):
        return err
    if kind is StoreUnavailableError:
        name = f"the store is throttled or unavailable ({name})"
    return kind(f"{where}: {name}; {advice}")


def backoff(attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (from 1): FIRST_DELAY doubling to MAX_DELAY, jittered."""
    delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (attempt - 1))
    return random.uniform(delay / 2, delay)


def _permission_advice() -> str:
    return f"let the task's user (uid {os.getuid()}) write there or choose another location"


def retrying(
    fn: Callable[[], T],
    what: str,
    *,
    attempts: int = ATTEMPTS,
    client_retried: Callable[[BaseException], bool] | None = None,
) -> T:
    """`fn()`, retried on a transient store fault; any other storage fault raised as `classify` names it.

    Args:
        fn: the operation; it must be safe to repeat (a whole-object PUT, a read, a listing, a delete).
        what: what is being done to what, as `classify`'s `where`.
        attempts: how many attempts in all.
        client_retried: tells whether the store's client has already retried this error itself (gcsfs retries
            each request 6 times); such an error ends the retries at once.

    Raises:
        StoreUnavailableError: the fault stayed transient through every attempt (exit 142, retryable).
        NoSpaceError, DeniedError, QuotaError: a permanent fault, at once (as is when `fn` raised it named
            already: a fault named inside, a StoreUnavailableError included, is not retried again).
    """
    started = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            fault = classify(err, what)
            if fault is None or fault is err:
                raise
            if not isinstance(fault, StoreUnavailableError):
                raise fault from err
            _, name, _ = _fault(err) or (None, type(err).__name__, "")
            retried_by_client = client_retried is not None and client_retried(err)
            if attempt == attempts or retried_by_client:
                tries = "its client's retries" if retried_by_client and attempt == 1 else f"{attempt} attempts"
                raise StoreUnavailableError(
                    f"{what}: the store stayed throttled or unavailable through {tries} in "
                    f"{time.monotonic() - started:.1f} s (last: {name}); {_TRANSIENT_ADVICE}"
                ) from err
            delay = backoff(attempt)
            log.warning("%s: %s; attempt %d of %d failed, retrying in %.1f s", what, name, attempt, attempts, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def _fault(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    """(the fault's class, what happened in a few words, what to do) for `err`, or None."""
    if isinstance(err, StorageFaultError):
        return type(err), str(err), ""
    for found in (_s3_fault(err), _gcs_fault(err), _os_fault(err), _transient(err), _by_message(err)):
        if found is not None:
            return found
    return None


def _chain(err: BaseException) -> Iterator[BaseException]:
    """`err` and the errors behind it (causes and contexts), each once."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _detail(text: str) -> str:
    return " ".join(str(text).split())[:200].rstrip(".")


def _s3_fault(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    for cause in _chain(err):
        if _is_any(cause, {("botocore.exceptions", "NoCredentialsError")}):
            return (
                DeniedError,
                "no credentials found",
                "give the task AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (a Secret) or an IAM role",
            )
        response = getattr(cause, "response", None)
        if not (isinstance(response, dict) and "Error" in response):
            continue
        code = str(response["Error"].get("Code", ""))
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = _detail(response["Error"].get("Message", ""))
        name = " ".join(str(p) for p in (status, code) if p) + (f": {message}" if message else "")
        if code in _S3_DENIED:
            return DeniedError, f"access denied ({name})", "check the credentials and their permissions on the bucket"
        if "quota" in code.lower():
            return QuotaError, f"quota exceeded ({name})", _QUOTA_ADVICE
        if code in _S3_NO_SPACE or status == 507:
            return NoSpaceError, f"the store has no space left ({name})", "free space on the store or add capacity"
        if code in _S3_TRANSIENT or status in _HTTP_TRANSIENT:
            return StoreUnavailableError, name, _TRANSIENT_ADVICE
        return None
    return None


def _gcs_fault(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    for cause in _chain(err):
        module = type(cause).__module__
        if module.startswith("gcsfs") and type(cause).__name__ == "HttpError":
            code = getattr(cause, "code", None)
            response = getattr(cause, "_error_response", None) or {}
            reasons = " ".join(str(e.get("reason", "")) for e in response.get("errors", []) if isinstance(e, dict))
            name = _detail(f"{code}: {getattr(cause, 'message', '') or cause} {reasons}".strip())
            return _http_fault(code, name, reasons)
        if module.startswith("aiohttp") and isinstance(getattr(cause, "status", None), int):
            return _http_fault(cause.status, _detail(f"{cause.status}: {getattr(cause, 'message', '')}"), "")
        if module.startswith("google.api_core") and isinstance(getattr(cause, "code", None), int):
            name = _detail(f"{cause.code}: {getattr(cause, 'message', '') or cause} {getattr(cause, 'reason', '')}")
            return _http_fault(cause.code, name, str(getattr(cause, "reason", "") or ""))
        if module.startswith("google.auth") and type(cause).__name__ in ("RefreshError", "DefaultCredentialsError"):
            return (
                DeniedError,
                f"no usable Google credentials ({_detail(str(cause))})",
                "give the pod a Google service account (workload identity or GOOGLE_APPLICATION_CREDENTIALS)",
            )
        # gcsfs raises a GCS 403 as OSError("Forbidden: PATH\nMESSAGE"), the reason dropped.
        if type(cause) is OSError and cause.errno is None and str(cause).startswith("Forbidden: "):
            message = str(cause).partition("\n")[2] or str(cause)
            return _http_fault(403, _detail(f"403 Forbidden: {message}"), message)
    return None


def _http_fault(code: object, name: str, reasons: str) -> tuple[type[StorageFaultError], str, str] | None:
    lowered = f"{name} {reasons}".lower()
    if code in (401, 403):
        if "quota" in lowered:
            return QuotaError, f"quota exceeded ({name})", _QUOTA_ADVICE
        if "ratelimit" in lowered.replace(" ", "") or "rate limit" in lowered:
            return StoreUnavailableError, name, _TRANSIENT_ADVICE
        return DeniedError, f"access denied ({name})", "check the credentials and their permissions on the bucket"
    if code in _HTTP_TRANSIENT or (isinstance(code, int) and 500 <= code < 600):
        return StoreUnavailableError, name, _TRANSIENT_ADVICE
    return None


def _os_fault(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    for cause in _chain(err):
        if not isinstance(cause, OSError) or cause.errno is None:
            continue
        code = errno.errorcode.get(cause.errno, str(cause.errno))
        if cause.errno == errno.ENOSPC:
            return NoSpaceError, f"no space left on the device ({code})", _NO_SPACE_ADVICE
        if cause.errno == errno.EDQUOT:
            return QuotaError, f"disk quota exceeded ({code})", _QUOTA_ADVICE
        if cause.errno == errno.EROFS:
            return DeniedError, f"read-only file system ({code})", _READ_ONLY_ADVICE
        if cause.errno in (errno.EACCES, errno.EPERM):
            return DeniedError, f"permission denied ({code})", _permission_advice()
    return None


def _transient(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    for cause in _chain(err):
        if isinstance(cause, (ConnectionError, TimeoutError)) or _is_any(cause, _TRANSIENT_TYPES):
            return StoreUnavailableError, _detail(f"{type(cause).__name__}: {cause}"), _TRANSIENT_ADVICE
    return None


def _is_any(err: BaseException, types: set[tuple[str, str]]) -> bool:
    """Whether `err` is an instance of one of `types` (module, class) among the modules already imported."""
    for module, name in types:
        loaded = sys.modules.get(module)
        cls = getattr(loaded, name, None) if loaded is not None else None
        if isinstance(cls, type) and isinstance(err, cls):
            return True
    return False


def _by_message(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    """TensorFlow's file errors (and others without an errno) by what their message says."""
    for cause in _chain(err):
        text = str(getattr(cause, "message", "") or cause)
        kind = type(cause).__name__
        tensorflow = type(cause).__module__.startswith("tensorflow")
        if "No space left on device" in text:
            return NoSpaceError, f"no space left on the device (ENOSPC, {kind})", _NO_SPACE_ADVICE
        if "Disk quota exceeded" in text:
            return QuotaError, f"disk quota exceeded (EDQUOT, {kind})", _QUOTA_ADVICE
        if "Read-only file system" in text:
            return DeniedError, f"read-only file system (EROFS, {kind})", _READ_ONLY_ADVICE
        if tensorflow and (kind == "PermissionDeniedError" or "Permission denied" in text):
            return DeniedError, f"permission denied ({_detail(f'{kind}: {text}')})", _permission_advice()
    return None


def _tensorflow_transient(err: BaseException) -> tuple[type[StorageFaultError], str, str] | None:
    """TensorFlow's transient errors of a store: unavailable, a deadline, or its gs:// client's retries spent."""
    for cause in _chain(err):
        if not type(cause).__module__.startswith("tensorflow"):
            continue
        kind = type(cause).__name__
        text = str(getattr(cause, "message", "") or cause)
        if any(sign in text.lower() for sign in _PEER_SIGNS):
            return None
        if kind in ("UnavailableError", "DeadlineExceededError") or (
            kind == "AbortedError" and "retry attempts failed" in text
        ):
            return StoreUnavailableError, _detail(f"{kind}: {text}"), _TRANSIENT_ADVICE
    return None
