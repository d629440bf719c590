"""What every entry point shares: logging set-up and turning known failures into one line and an exit code."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from trainer.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PEER_UNAVAILABLE, KubernetesError, PeerUnavailableError, UsageError


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time of each record (it may be replaced after set-up)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(prefix: str = "") -> None:
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.getLogger("tensorflow").setLevel(logging.WARNING)


def run_cli(body: Callable[[], Any], prefix: str = "") -> int:
    """Runs `body`; bad input exits 2 and a lost peer 138 (retryable), each with one line on stderr."""
    setup_logging(prefix)
    try:
        body()
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PeerUnavailableError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_PEER_UNAVAILABLE
    except KubernetesError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_FAILED
    return 0
