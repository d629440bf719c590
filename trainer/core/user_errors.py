"""What an error raised by your own code (`source` 'fn:...', `model_fn`) means, and calling that code.

| raised by your function                                                  | means                 | exit          |
| ------------------------------------------------------------------------ | --------------------- | ------------- |
| OSError (IOError, ConnectionError, TimeoutError, ...) other than below;  | transient: retried    | 142 after the |
| tf.errors.UnavailableError, DeadlineExceededError; a store's throttling  | with backoff          | last attempt  |
| no space left, permission denied, quota exceeded (`trainer.core.faults`) | a storage fault    | 3, 4, 5       |
| FileNotFoundError, NotADirectoryError, IsADirectoryError; anything else: | bad input             | 2             |
| TypeError, ValueError, AttributeError, ImportError, a wrong return, ...  |                       |               |

An error TensorFlow raises while it reads your dataset (`tf.data` runs your generator or `py_function` in its own
threads) carries your exception only as text ("UnknownError: ... ConnectionError: peer reset"): it is judged by the
exception's name in that text. A transient error is retried as the store operations are (`trainer.core.faults`:
`ATTEMPTS` attempts, 1 s doubling to 8 s with jitter between them); one that lasts ends the step with
StoreUnavailableError (142), which the supervisor and Kubernetes retry.
"""

from __future__ import annotations

import builtins
import logging
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.core.errors import StorageFaultError, StoreUnavailableError, UsageError

log = logging.getLogger(__name__)

T = TypeVar("T")

_PERMANENT_OS = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
_TRANSIENT_TF = ("UnavailableError", "DeadlineExceededError")
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Timeout))(?::\s*(?P<text>.*))?$")


class TransientError(Exception):
    """A transient error of your code, named: retried, then StoreUnavailableError."""


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`; for TensorFlow's errors, the exception your code raised inside them."""
    inner = _inner_exception(err)
    if inner:
        return inner
    text = str(getattr(err, "message", "") or err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def _inner_exception(err: BaseException) -> str:
    """The last `Name: message` line after a traceback in a TensorFlow error's message, else ''."""
    if not type(err).__module__.startswith("tensorflow"):
        return ""
    message = str(getattr(err, "message", "") or "")
    if "Traceback (most recent call last)" not in message:
        return ""
    lines = [line.strip() for line in message.split("Traceback (most recent call last)", 1)[1].splitlines()]
    found = [line for line in lines if _EXCEPTION_LINE.match(line)]
    return found[-1][:300] if found else ""


def _exception_class(name: str) -> type | None:
    """The exception class a traceback names (`OSError`, `requests.exceptions.ConnectionError`), if it is loaded."""
    module, _, attribute = name.rpartition(".")
    owner = sys.modules.get(module) if module else builtins
    found = getattr(owner, attribute, None) if owner is not None else None
    return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _transient_class(cls: type) -> bool:
    return issubclass(cls, OSError) and not issubclass(cls, _PERMANENT_OS)


def judge(err: BaseException, where: str) -> Exception:
    """The error to raise for `err`, raised by your code while doing `where` (the line's start).

    Returns:
        TransientError (to retry), a StorageFaultError for a full disk, a refusal or a quota (exit 3, 4, 5), or
        UsageError (bad input, exit 2).
    """
    from trainer.core.faults import classify

    if isinstance(err, (TransientError, StorageFaultError, UsageError)):
        return err
    line = one_line(err)
    fault = classify(err, where)
    if fault is not None and not isinstance(fault, StoreUnavailableError):
        return fault
    if fault is not None or (isinstance(err, OSError) and not isinstance(err, _PERMANENT_OS)):
        return TransientError(f"{where}: {line}")
    if type(err).__module__.startswith("tensorflow"):
        if type(err).__name__ in _TRANSIENT_TF:
            return TransientError(f"{where}: {line}")
        match = _EXCEPTION_LINE.match(line)
        inner = _exception_class(match["name"]) if match and _inner_exception(err) else None
        if inner is not None and _transient_class(inner):
            return TransientError(f"{where}: {line}")
    return UsageError(f"{where}: {line}")


def retried(attempt: Callable[[], T], what: str, attempts: int | None = None) -> T:
    """`attempt()`, repeated while it raises TransientError (with backoff), at most `attempts` times in all.

    Args:
        attempt: the call of your code and what it needs redone each time; it raises `judge`'s errors.
        what: your function as the setting names it, for the lines (`source 'fn:m:datasets'`).
        attempts: default `trainer.core.faults.ATTEMPTS`.

    Raises:
        StoreUnavailableError: the error stayed transient through every attempt (exit 142, retryable).
    """
    from trainer.core import faults

    attempts = attempts or faults.ATTEMPTS
    started = time.monotonic()
    for number in range(1, attempts + 1):
        try:
            return attempt()
        except TransientError as err:
            if number == attempts:
                raise StoreUnavailableError(
                    f"{err}; a transient error of {what}, it failed the same way {attempts} times in "
                    f"{time.monotonic() - started:.1f} s: the step ends with 142 (a training task restarts on it; a "
                    "later run or a KFP retry of the run may not meet it)"
                ) from None
            delay = faults.backoff(number)
            log.warning("%s; attempt %d of %d failed, retrying in %.1f s", err, number, attempts, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def call_once(function: Callable[..., Any], named_by: str, *args: Any) -> Any:
    """`function(*args)`, an error it raises judged (`judge`): TransientError for the caller to retry.

    Raises:
        TransientError, StorageFaultError, UsageError: as `judge` says.
    """
    shown = ", ".join(repr(a) if isinstance(a, str) else type(a).__name__ for a in args)
    try:
        return function(*args)
    except Exception as err:
        raise judge(err, f"{named_by} failed when called with ({shown})") from None


def call(function: Callable[..., Any], named_by: str, *args: Any) -> Any:
    """`function(*args)`, its errors judged (`judge`) and transient ones retried (`retried`).

    Raises:
        UsageError: it raised a programming error or refused its input (exit 2).
        StorageFaultError: it hit a full disk, a refusal or a quota (exit 3, 4, 5); StoreUnavailableError when a
            transient error lasted through every attempt (142).
    """
    return retried(lambda: call_once(function, named_by, *args), named_by)
