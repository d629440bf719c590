"""The order in which `make test` hands test files to its pytest-xdist processes: the longest first.

`make test` runs the whole suite in one pytest run on 2 processes, by files (`--dist loadfile`): pytest-xdist gives
each process two files to start with and the next one in order whenever a process is nearly through its own. A
file's tests stay on one process (they share its module fixtures), so the run ends when the process that got the
last long file finishes it. pytest-xdist orders files by their number of tests unless told not to
(`--no-loadscope-reorder`); the files that take longest here have few tests (a run that kills and replaces workers
is one test of a minute or more), so it left them to the end, with one process idle beside them. Here the files are
ordered by the seconds they took when last recorded (DURATIONS, written by `pytest --record-durations`), the
longest first; a file not recorded goes after them, in collection order. The record only orders the run: a stale
one makes it slower, never different.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from tests.support.paths import ROOT

DURATIONS = ROOT / "tests" / "durations.json"


def file_of(nodeid: str) -> str:
    """The test file of a test id, as the record names it: tests/test_x.py."""
    return nodeid.split("::", 1)[0]


def read(path: Path = DURATIONS) -> dict[str, float]:
    """The recorded seconds per test file; empty when there is no record."""
    return json.loads(path.read_text()) if path.exists() else {}


def longest_first(items: list, durations: dict[str, float]) -> None:
    """Sorts collected items in place by their file's recorded seconds, longest first; a file's tests keep their
    order and stay together (the sort is stable, and one file has one key)."""
    items.sort(key=lambda item: -durations.get(file_of(item.nodeid), 0.0))


class Recorder:
    """A pytest plugin that adds up each file's setup, call and teardown seconds as the reports arrive (under
    pytest-xdist, in the controlling process) and writes them into PATH when the session ends: the files this run
    recorded replace theirs, the others keep what they had (a run of some files leaves the rest of the record)."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        merged = read(self.path) | {f: round(s, 1) for f, s in self.seconds.items()}
        ordered = dict(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")
