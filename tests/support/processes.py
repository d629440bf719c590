"""Child processes of the project's commands: their environment, output collected while they run, finding them."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.paths import ROOT

# The epochs of the tests' shared 2-worker run (conftest's `undisturbed_two_workers`) and of the faulted run
# compared with it: on the shipped sample, 2 workers pass 0.95 test accuracy from about epoch 4.
UNDISTURBED_EPOCHS = 6


def wait_for(condition, what: str, timeout: float = 60) -> None:
    """Returns once `condition()` is true; fails the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def child_env(extra: dict | None = None) -> dict[str, str]:
    """This environment for a child that imports the project (PYTHONPATH, unbuffered, no TF_CONFIG), EXTRA added."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="1", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env.update(extra or {})
    return env


def trainer_args(data, model_dir, *extra: str) -> list[str]:
    """The trainer's own flags: `--data DATA --model-dir MODEL_DIR` then EXTRA."""
    return ["--data", str(data), "--model-dir", str(model_dir), *extra]


def run_module(module: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m module args...` from the repo root and returns the finished process (text output)."""
    full_env = dict(os.environ)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.pop("TF_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


class Streamed:
    """A process whose merged output is collected line by line while it runs."""

    def __init__(self, args, env):
        self.proc = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern, timeout):
        """The first match of PATTERN in a line the process printed, waiting up to TIMEOUT seconds for one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if m := re.search(pattern, line):
                    return m
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.lines[-40:]))

    def finish(self, timeout):
        """Waits for the exit (and the last line) and returns the exit code."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self):
        """SIGKILLs the process if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()

    def kill_once(self, pattern, find_pid, timeout=400, finish=600):
        """Once a line matches `pattern`, SIGKILLs the process `find_pid()` names; then waits for the end.

        Returns:
            (the run's exit code, the killed pid).
        """
        try:
            self.wait_for(pattern, timeout)
            pid = find_pid()
            assert pid, "\n".join(self.lines[-40:])
            os.kill(pid, signal.SIGKILL)
            return self.finish(finish), pid
        finally:
            self.kill()


def launch(*args: str, env: dict | None = None) -> Streamed:
    """`trainer-launch ARGS` with its merged output collected line by line; ENV added to the environment."""
    return Streamed([sys.executable, "-m", "trainer.launch", *args], child_env(env))


def _parents() -> dict[int, int]:
    """Each running process's parent pid, from /proc."""
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return parents


def children(root: int | None = None) -> list[int]:
    """The pids of the processes whose parent is ROOT (this process by default)."""
    root = os.getpid() if root is None else root
    return [pid for pid, parent in _parents().items() if parent == root]


def descendants(root: int | None = None) -> list[int]:
    """The pids of the processes below ROOT (this process by default): what this test started, not a test beside it."""
    parents = _parents()
    below, frontier = [], {os.getpid() if root is None else root}
    while frontier:
        found = [pid for pid, parent in parents.items() if parent in frontier]
        below += found
        frontier = set(found)
    return below


def worker_process(index, command):
    """The pid of a process this test started whose command line passes `command(argv)` and whose TF_CONFIG is
    worker INDEX's."""
    for pid in descendants():
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if not command(argv):
            continue
        config = next((e[len(b"TF_CONFIG=") :] for e in environ if e.startswith(b"TF_CONFIG=")), b"{}")
        if json.loads(config).get("task", {}).get("index") == index:
            return int(pid)
    return None


def script_processes(script, under) -> list[int]:
    """The pids of `script`'s processes still running whose MODEL_DIR is under `under` (a test's own tasks)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            running = str(script).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            if running and f"MODEL_DIR={under}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def processes_alive(pids):
    """Those of PIDS still running."""
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive
