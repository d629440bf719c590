"""The suite's own process finders: a test kills what it started, never a process of a test running beside it."""

import json
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
