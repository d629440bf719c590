"""What every entry point shares: logging set-up and the exit-code contract (`trainer.core.errors`).

`run_cli` runs a CLI's body and `run_step` a pipeline step's; both turn a known failure into one `error:` line on
stderr and its exit code, and an unexpected one into its traceback followed by an `error:` line and exit 1.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from trainer.core.errors import (
    EXIT_FAILED,
    ChiefFailedError,
    PeerUnavailableError,
    ServiceError,
    StartupTimeoutError,
    TaskFailedError,
    UsageError,
    exit_code,
)

T = TypeVar("T")
_KNOWN = (UsageError, PeerUnavailableError, StartupTimeoutError, ServiceError, ChiefFailedError)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each record (it may be replaced after set-up)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(prefix: str = "") -> None:
    """Logs INFO and above to stderr, each line with its time, `prefix`, level and logger."""
    handler = _StderrHandler()
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)


def report(error: BaseException) -> int:
    """Writes the one `error:` line for `error` (after its traceback when it is unexpected); returns its exit code.

    A failed training process has written its own line already, so its failure adds none unless it carries a
    runner's `reason` (which of its tasks failed).
    """
    if isinstance(error, TaskFailedError):
        if error.reason:
            print(f"error: {error.reason}", file=sys.stderr, flush=True)
        return error.code
    if not isinstance(error, _KNOWN):
        traceback.print_exception(error, file=sys.stderr)
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print(f"error: {error}", file=sys.stderr, flush=True)
    return exit_code(error)


def run_cli(body: Callable[[], Any], prefix: str = "") -> int:
    """Runs a CLI's `body` under the exit-code contract and returns the code (0 on success)."""
    setup_logging(prefix)
    try:
        result = body()
    except Exception as error:  # noqa: BLE001 - every failure gets the contract's line and code
        return report(error)
    return result if isinstance(result, int) else 0


def run_step(body: Callable[..., T], **kwargs: Any) -> T:
    """Runs a pipeline step's `body(**kwargs)`; on failure exits the process with the contract's code."""
    setup_logging()
    try:
        return body(**kwargs)
    except Exception as error:  # noqa: BLE001 - every failure gets the contract's line and code
        sys.exit(report(error))
