"""Every task of a TFJob-shaped job at once, as local processes: what `pipelines/tfjob.py --local` runs.

Each task (the chief, the parameter servers, the workers, the evaluator) is one process running the step a
compiled pipeline's task runs, `trainer.steps.command_task`, with the contract's exit codes
(`trainer.core.errors`): the same TF_CONFIG, supervisor, restarts in place and, in a job with parameter servers,
the same chief status. Its lines go to this process's stdout prefixed with its name (`[worker 1] ...`) and to its
own log file:

    ROOT/cluster/cluster.json
    ROOT/tasks/<type>-<index>/task.json   the task's arguments (`python -m trainer.local_job task.json` runs it)
    ROOT/tasks/<type>-<index>/task.log    its output
    ROOT/tasks/<type>-<index>/model/      its MODEL_DIR: the chief's saved_model/ and job.json

A job runs only when this machine can hold every task at once (`capacity`): a TensorFlow job whose tasks wait on
each other cannot finish with some of them queued.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import IO, Any

from trainer.command.tfjob_spec import JobSpec, Replica
from trainer.config import settings
from trainer.core import cpus
from trainer.core.errors import EXIT_FAILED, TaskFailedError, UsageError
from trainer.core.files import read_json, write_json
from trainer.core.processes import is_error_line, shell_code, signal_group
from trainer.core.tasks import TaskId

log = logging.getLogger(__name__)

# Memory per task, measured here (2 CPUs) on the example's job (pipelines/tfjob_example: a tf-keras CNN on the sample,
# 2 workers): the command's TensorFlow process peaks at about 790 MiB and the task's supervisor at about 25 MiB. A
# bound to refuse what cannot fit, not a limit: a larger model needs more.
TASK_MIB = 1024
# The tasks of one job spend much of each step waiting on each other (collectives, parameter-server RPCs), so two
# share a CPU. Beyond that every synchronous step waits on time-sliced peers, and their start-up alone (about 6.5 s of
# CPU each to import TensorFlow and tf-keras) eats into startup_timeout.
TASKS_PER_CPU = 2
STOP_GRACE = 15.0
EVALUATOR_GRACE = 60.0
EVALUATOR = "evaluator"
ARGUMENTS_FILE = "task.json"
LOG_FILE = "task.log"


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of the job: its type, index and replica."""

    type: str
    index: int
    replica: Replica

    @property
    def name(self) -> str:
        """`worker 1`: how the supervisor and this runner name it."""
        return TaskId(self.type, self.index).name

    @property
    def directory(self) -> str:
        """`worker-1`: its directory under ROOT/tasks."""
        return TaskId(self.type, self.index).directory


@dataclasses.dataclass(frozen=True)
class JobRun:
    """A finished local run.

    Attributes:
        run_id: the run's id (its checkpoint and status keys).
        codes: every task's exit code by name (`chief 0`, `worker 1`, ...).
        model: the chief's model directory (the Chief replica's task, else worker 0).
        model_dirs: every task's model directory.
        seconds: the run's wall time.
    """

    run_id: str
    codes: dict[str, int]
    model: str
    model_dirs: tuple[str, ...]
    seconds: float


def job_tasks(job: JobSpec) -> list[Task]:
    """The job's tasks in the manifest reader's order: chief, parameter servers, workers, evaluator."""
    return [Task(replica.type, index, replica) for replica in job.replicas for index in range(replica.count)]


def chief_of(tasks: Sequence[Task]) -> Task:
    """TensorFlow's chief: the Chief replica's task if the job has one, else worker 0.

    Raises:
        UsageError: the job has neither.
    """
    for task_type in ("chief", "worker"):
        found = next((t for t in tasks if t.type == task_type and t.index == 0), None)
        if found:
            return found
    raise UsageError("the job has no Chief and no Worker replica; give Worker (and optionally Chief)")


def _available_mib(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int | None:
    """Memory available to new processes: MemAvailable, less when this cgroup's memory.max leaves less."""
    available = None
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(os.path.join(cgroup, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(cgroup, "memory.current")) as f:
            current = int(f.read().strip())
        if limit.isdigit():
            left = (int(limit) - current) // (1024 * 1024)
            available = left if available is None else min(available, left)
    except (OSError, ValueError):
        pass
    return available


def capacity(budget: cpus.CpuBudget | None = None, available_mib: int | None = None) -> tuple[int, str]:
    """How many tasks this machine runs at once, and why: the fewer of `TASKS_PER_CPU` per CPU and `TASK_MIB` each."""
    budget = budget or cpus.cpu_budget()
    by_cpu = max(1, math.floor(TASKS_PER_CPU * budget.cpus + 1e-9))
    why = f"{TASKS_PER_CPU} per CPU of {budget.describe()}"
    if available_mib is None:
        available_mib = _available_mib()
    if available_mib is None:
        return by_cpu, why
    by_memory = max(1, available_mib // TASK_MIB)
    why += f" and one per {TASK_MIB} MiB of the {available_mib} MiB of memory available"
    return min(by_cpu, by_memory), why


def check_tasks(count: int, budget: cpus.CpuBudget | None = None, available_mib: int | None = None) -> None:
    """Refuses a job whose `count` tasks this machine cannot run at once.

    Raises:
        UsageError: one line with the bound and how it was reached.
    """
    bound, why = capacity(budget, available_mib)
    if count > bound:
        raise UsageError(
            f"the job has {count} tasks and every one must run at the same time; allowed here: 1 to {bound} ({why}; "
            "each task is a TensorFlow process); run it on a cluster (--compile)"
        )


def first_failure(exits: Sequence[tuple[Task, int]]) -> tuple[Task, int] | None:
    """The task that failed the run, from the tasks' exits in the order they came: the first non-evaluator to fail.

    A side-car evaluator's exit never fails a run.
    """
    return next(((task, code) for task, code in exits if code != 0 and task.type != EVALUATOR), None)


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Runner:
    """The task processes of one run: started together, their lines pumped, stopped together."""

    def __init__(self, tasks: Sequence[Task], root: str) -> None:
        self.tasks = list(tasks)
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.last_error: dict[str, str] = {}
        self.last_line: dict[str, str] = {}
        self.events: queue.Queue[tuple[int, int]] = queue.Queue()
        self.stopped: set[int] = set()
        self._threads: list[threading.Thread] = []
        self._write = threading.Lock()

    def start(self, arguments: Sequence[dict[str, Any]]) -> None:
        """Starts one process per task with its arguments file; threads pump its lines and wait for its exit."""
        shares = cpus.shares(len(self.tasks), pin=False)
        for position, (task, args) in enumerate(zip(self.tasks, arguments, strict=True)):
            directory = os.path.join(self.root, "tasks", task.directory)
            path = os.path.join(directory, ARGUMENTS_FILE)
            write_json(path, args)
            env = dict(os.environ)
            env.setdefault(cpus.INTRA_ENV, str(shares[position].threads))
            env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            env["PYTHONUNBUFFERED"] = "1"
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainer.local_job", path],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.procs.append(proc)
            log.info("started %s (pid %d), its output also in %s", task.name, proc.pid, directory)
            sink = open(os.path.join(directory, LOG_FILE), "ab")  # noqa: SIM115 - the pump closes it
            for target, target_args in ((self._pump, (task.name, proc.stdout, sink)), (self._wait, (position,))):
                thread = threading.Thread(target=target, args=target_args, daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, name: str, stream: IO[bytes], sink: IO[bytes]) -> None:
        with sink:
            for raw in iter(stream.readline, b""):
                sink.write(raw)
                sink.flush()
                line = raw.decode(errors="replace").rstrip("\n")
                if is_error_line(line):
                    self.last_error[name] = line
                if line.strip():
                    self.last_line[name] = line
                with self._write:
                    sys.stdout.write(f"[{name}] {line}\n")
                    sys.stdout.flush()

    def detail(self, task: Task) -> str:
        """What a failed task said: its last `error:` line (else its last line) and where its whole output is."""
        said = self.last_error.get(task.name) or f"its last line: {self.last_line.get(task.name, '(none)')}"
        return f"{said} (all of it in {os.path.join(self.root, 'tasks', task.directory, LOG_FILE)})"

    def _wait(self, position: int) -> None:
        self.events.put((position, shell_code(self.procs[position].wait())))

    def live(self) -> list[int]:
        """The positions of the tasks whose process still runs."""
        return [i for i, p in enumerate(self.procs) if p.poll() is None]

    def stop(self, positions: Sequence[int], grace: float = STOP_GRACE) -> None:
        """SIGTERM to these tasks (each supervisor stops its command and exits 143), SIGKILL after `grace` seconds."""
        self.stopped.update(positions)
        for position in positions:
            log.info("stopping %s", self.tasks[position].name)
            signal_group(self.procs[position], signal.SIGTERM)
        deadline = time.monotonic() + grace
        for position in positions:
            try:
                self.procs[position].wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %g s; killing it", self.tasks[position].name, grace)
                signal_group(self.procs[position], signal.SIGKILL)
                self.procs[position].wait()

    def drain(self) -> None:
        """Waits for the pumps to write every line the tasks wrote."""
        for thread in self._threads:
            thread.join(timeout=5)


def _ignore(signals: Sequence[int]) -> None:
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def _create_cluster(job: JobSpec, directory: str, run_id: str) -> None:
    """The job's cluster.json, as the pipeline's `create job cluster` step writes it."""
    from trainer import steps

    servers, workers = job.replica("ps"), job.replica("worker")
    steps.create_job_cluster(
        output_dir=directory,
        run_id=run_id,
        chief=job.replica("chief") is not None,
        num_workers=workers.count if workers else 0,
        cluster_mode="local",
        port=job.port,
        num_ps=servers.count if servers else 0,
        evaluator=job.replica(EVALUATOR) is not None,
    )


def run_job(
    job: JobSpec,
    root: str,
    saved_model: str = "",
    startup_timeout: float = settings.default("startup_timeout"),
    unschedulable_timeout: float = settings.default("unschedulable_timeout"),
    max_restarts: int = settings.default("max_restarts"),
    checkpoint_dir: str = "",
    chief_timeout: float = settings.default("chief_timeout"),
    run_id: str | None = None,
    evaluator_grace: float = EVALUATOR_GRACE,
) -> JobRun:
    """Runs every task of `job` at once as a local process, each `steps.command_task` as the pipeline's task runs it.

    The run succeeds when the chief's task succeeded and no other task failed; an evaluator's exit never fails it,
    and once the others have succeeded an evaluator still running has `evaluator_grace` seconds to end before it is
    stopped. The first task to fail stops the others, and so do SIGINT, SIGTERM and the job's
    `runPolicy.activeDeadlineSeconds`.

    Args:
        job: the job, its paths already this machine's (`pipelines.tfjob.for_this_machine`).
        root: the run's directory (module docstring).
        saved_model: where the chief's command writes its SavedModel (default `$(MODEL_DIR)/saved_model`).
        startup_timeout: seconds each task waits for the cluster to form.
        unschedulable_timeout: passed on to each task (it applies in Kubernetes mode only).
        max_restarts: restarts in place of each task's command, by its replica's restart policy.
        checkpoint_dir: CHECKPOINT_DIR of every task (default: a directory of the run under the temporary one).
        chief_timeout: seconds the servers of a parameter-server job keep serving after the chief's heartbeat stops.
        run_id: the run's id; default a new one.
        evaluator_grace: seconds an evaluator may still run once the other tasks have succeeded.

    Returns:
        The run: every task's exit code, the chief's model directory and the wall time.

    Raises:
        UsageError: a bad setting, or more tasks than this machine runs at once; nothing was started.
        TaskFailedError: a task failed (its name, code and last error line are the reason), a signal stopped the
            run (128 + its number), or it passed its deadline (1).
    """
    tasks = job_tasks(job)
    chief = chief_of(tasks)
    for name, value in (
        ("startup_timeout", startup_timeout),
        ("unschedulable_timeout", unschedulable_timeout),
        ("max_restarts", max_restarts),
        ("checkpoint_dir", checkpoint_dir),
        ("chief_timeout", chief_timeout),
    ):
        settings.check(name, value)
    if not 0 <= evaluator_grace <= 86_400:
        raise UsageError(f"evaluator grace {evaluator_grace!r} is not allowed; allowed: 0 to 86400 seconds")
    check_tasks(len(tasks))
    run_id = run_id or f"{job.name}-{uuid.uuid4().hex[:12]}"
    root = os.path.abspath(root)
    _create_cluster(job, os.path.join(root, "cluster"), run_id)
    model_dirs = [os.path.join(root, "tasks", t.directory, "model") for t in tasks]
    arguments = [
        {
            "cluster_dir": os.path.join(root, "cluster"),
            "task_type": task.type,
            "index": task.index,
            "model_dir": model_dir,
            "run_id": run_id,
            "command": [*task.replica.command, *task.replica.args],
            "env": [list(pair) for pair in task.replica.env],
            "working_dir": task.replica.working_dir,
            "restart_policy": task.replica.restart_policy,
            "success_policy": job.success_policy,
            "saved_model": saved_model,
            "image": task.replica.image,
            "startup_timeout": startup_timeout,
            "unschedulable_timeout": unschedulable_timeout,
            "max_restarts": max_restarts,
            "checkpoint_dir": checkpoint_dir,
            "cluster_mode": "local",
            "chief_timeout": chief_timeout,
        }
        for task, model_dir in zip(tasks, model_dirs, strict=True)
    ]
    log.info("running %d tasks at once: %s (run %s, %s)", len(tasks), ", ".join(t.name for t in tasks), run_id, root)
    started = time.monotonic()
    runner = _Runner(tasks, root)
    exits: list[tuple[Task, int]] = []

    def stopped(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    handlers = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    previous = {sig: signal.signal(sig, stopped) for sig in handlers}
    try:
        runner.start(arguments)
        late = _wait(runner, exits, evaluator_grace, started + job.deadline if job.deadline else 0)
    except _Stopped as stop:
        _ignore(handlers)
        log.warning("received signal %d; stopping every task", stop.signum)
        runner.stop(runner.live())
        raise TaskFailedError(
            128 + stop.signum,
            f"stopped by signal {stop.signum} ({signal.Signals(stop.signum).name}): every task stopped",
        ) from None
    finally:
        _ignore(handlers)
        if runner.live():
            runner.stop(runner.live(), grace=0)
        runner.drain()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if late:
        raise TaskFailedError(
            EXIT_FAILED,
            f"the run took longer than runPolicy.activeDeadlineSeconds ({job.deadline} s); every task stopped",
        )
    codes = {task.name: code for task, code in exits}
    failed = first_failure(exits)
    if failed:
        task, code = failed
        raise TaskFailedError(code, f"{task.name} failed with exit code {code}: {runner.detail(task)}")
    seconds = round(time.monotonic() - started, 1)
    log.info("every task finished in %.1f s: %s", seconds, json.dumps(codes))
    return JobRun(run_id, codes, model_dirs[tasks.index(chief)], tuple(model_dirs), seconds)


def _wait(runner: _Runner, exits: list[tuple[Task, int]], evaluator_grace: float, deadline: float) -> bool:
    """Collects every task's exit; returns whether the run passed `deadline` (monotonic seconds; 0: none).

    The first failure stops the others; once the training tasks have succeeded an evaluator has `evaluator_grace`
    seconds left; past the deadline every task is stopped.
    """
    training = {i for i, t in enumerate(runner.tasks) if t.type != EVALUATOR}
    done: set[int] = set()
    grace = None
    while len(done) < len(runner.tasks):
        ends = [t for t in (grace, deadline or None) if t is not None]
        timeout = max(0.0, min(ends) - time.monotonic()) if ends else None
        try:
            position, code = runner.events.get(timeout=timeout)
        except queue.Empty:
            if deadline and time.monotonic() >= deadline:
                runner.stop(runner.live())
                return True
            log.warning("the training tasks finished %g s ago; stopping the evaluator", evaluator_grace)
            runner.stop(runner.live())
            grace = None
            continue
        done.add(position)
        task = runner.tasks[position]
        exits.append((task, code))
        log.info("%s exited with code %d", task.name, code)
        if code and task.type == EVALUATOR:
            if position not in runner.stopped:
                log.warning("%s failed (exit code %d); an evaluator does not fail the run", task.name, code)
        elif code:
            runner.stop([i for i in runner.live() if i != position])
        elif training <= done and grace is None and len(done) < len(runner.tasks):
            grace = time.monotonic() + evaluator_grace
    return False


def _task(argv: Sequence[str]) -> dict[str, Any]:
    if len(argv) != 1 or not os.path.isfile(argv[0]):
        raise UsageError(f"{' '.join(argv) or 'nothing'} is not allowed; usage: python -m trainer.local_job TASK.json")
    from trainer import steps

    return steps.command_task(**read_json(argv[0]))


def main(argv: Sequence[str] | None = None) -> int:
    """One task: `steps.command_task` with the arguments in the JSON file named by the one argument; the exit code."""
    from trainer.core.entry import run_cli

    args = list(sys.argv[1:] if argv is None else argv)
    return run_cli(lambda: _task(args))


if __name__ == "__main__":
    sys.exit(main())
