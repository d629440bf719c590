"""The suite's own process finders: a test kills what it started, never a process of a test running beside it."""

import json
import logging
import os
import signal
import subprocess
import sys

from tests.support.processes import descendants, worker_process

MARK = "kfp-tf-support-probe"


def _probe(env):
    """A process shaped like worker 1's training process (its TF_CONFIG) that waits until it is killed."""
    return [sys.executable, "-c", "import sys, time; time.sleep(600)", MARK], env


def test_a_worker_is_found_among_this_tests_processes_and_not_among_anothers():
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})
    args, env = _probe(dict(os.environ, TF_CONFIG=tf_config))
    # A test beside this one: its process is not below this one (its parent has exited, as a sibling xdist worker's
    # launcher is no parent of ours).
    shell = subprocess.run(
        ["sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", *args], env=env, capture_output=True, text=True, check=True
    )
    other = int(shell.stdout)
    ours = subprocess.Popen(args, env=env)
    try:
        assert other not in descendants() and ours.pid in descendants()

        def probe(argv):
            return MARK.encode() in argv

        assert worker_process(1, probe) == ours.pid
        assert worker_process(0, probe) is None
    finally:
        ours.kill()
        ours.wait()
        os.kill(other, signal.SIGKILL)


def test_files_are_handed_out_longest_first_and_a_files_tests_stay_together():
    from types import SimpleNamespace

    from tests.support.schedule import longest_first

    ids = ["tests/test_a.py::t1", "tests/test_b.py::t1", "tests/test_b.py::t2", "tests/test_c.py::t1"]
    ids += ["tests/test_d.py::t1", "tests/test_c.py::t2[x]"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    longest_first(items, {"tests/test_c.py": 90.0, "tests/test_b.py": 12.5, "tests/test_gone.py": 300.0})
    assert [i.nodeid for i in items] == [
        "tests/test_c.py::t1",
        "tests/test_c.py::t2[x]",
        "tests/test_b.py::t1",
        "tests/test_b.py::t2",
        "tests/test_a.py::t1",
        "tests/test_d.py::t1",
    ], "recorded files by their seconds, then the others in collection order"


def test_the_recorder_adds_each_files_phases_and_writes_the_longest_first_keeping_files_it_did_not_run(tmp_path):
    from types import SimpleNamespace

    from tests.support.schedule import Recorder, read

    (tmp_path / "durations.json").write_text('{"tests/test_a.py": 99.0, "tests/test_c.py": 4.2}')
    recorder = Recorder(tmp_path / "durations.json")
    for nodeid, seconds in [("tests/test_a.py::t1", 1.2), ("tests/test_b.py::t1", 4.0), ("tests/test_a.py::t2", 3.0)]:
        for phase in (seconds, 0.1):  # a call and its teardown
            recorder.pytest_runtest_logreport(SimpleNamespace(nodeid=nodeid, duration=phase))
    recorder.pytest_sessionfinish()
    assert list(read(tmp_path / "durations.json").items()) == [
        ("tests/test_a.py", 4.4),
        ("tests/test_c.py", 4.2),
        ("tests/test_b.py", 4.1),
    ]


def test_this_session_collected_the_recorded_files_longest_first(request):
    from tests.support.paths import ROOT
    from tests.support.schedule import file_of, read

    recorded = read()
    assert any((ROOT / f).is_file() for f in recorded), "tests/durations.json names this suite's files"
    files = list(dict.fromkeys(file_of(item.nodeid) for item in request.session.items))
    seconds = [recorded.get(f, 0.0) for f in files]
    assert seconds == sorted(seconds, reverse=True), files


def test_an_entry_point_run_in_process_sets_the_root_logger_to_info():
    """The first of two: what an entry point called in-process leaves (conftest's _no_logging_leaks undoes it)."""
    from trainer.core.entry import setup_logging

    setup_logging()
    assert logging.getLogger("trainer.publishing.conditional").isEnabledFor(logging.INFO)


def test_the_next_test_sees_the_logging_it_started_with():
    """The test after it: INFO records are not captured unless the test sets a level on their logger."""
    root = logging.getLogger()
    assert root.level == logging.WARNING
    assert not logging.getLogger("trainer.publishing.conditional").isEnabledFor(logging.INFO)
    assert not any(type(h).__module__ == "trainer.core.entry" for h in root.handlers)
