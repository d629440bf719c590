"""Local launcher: N training workers on loopback, like torchrun for TensorFlow.

    trainer-launch --workers 2 -- --data /tmp/mnist --model-dir /tmp/model --epochs 5

Picks free loopback ports, builds one TF_CONFIG per worker with `trainer.cluster.topology.build_tf_config`, starts one
`trainer-train` per task (each supervises its own training process: start-up watchdog, prompt cancel, and with
`--max-restarts N` restarts in place that all workers converge on), prefixes every log line with the task's name,
and if any task fails for good stops the others (SIGTERM, then SIGKILL after a grace period) and exits with that
task's code.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from trainer.cluster import local_processes
from trainer.cluster.topology import tasks
from trainer.config.flags import Parser
from trainer.core.entry import run_cli
from trainer.core.errors import UsageError
from trainer.core.runs import new_run_id

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-launch (its own flags; the trainer's come after `--`)."""
    p = Parser(
        prog="trainer-launch",
        description="Run N trainer workers on this machine with a generated TF_CONFIG each.",
        usage="trainer-launch --workers N [--ps P] [--gpus-per-worker G] [--max-restarts R] [--grace S] -- "
        "TRAINING_ARGS...",
    )
    p.add_argument(
        "--workers",
        type=int,
        required=True,
        help=f"number of worker processes (1 to {local_processes.MAX_LOCAL_WORKERS})",
    )
    p.add_argument(
        "--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL when stopping workers"
    )
    p.add_argument(
        "--ps",
        type=int,
        default=0,
        help="parameter servers; with N > 0 runs chief + N ps + --workers workers under ParameterServerStrategy",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="each worker restarts its training process in place up to N times after a retryable failure "
        "(a lost peer, a killed training process), and a worker whose whole process is killed is replaced up to N "
        "times, as a lost pod is; all workers restart together and resume after the last finished epoch",
    )
    p.add_argument(
        "--gpus-per-worker",
        type=int,
        default=0,
        help="give each worker G GPUs of its own (its CUDA_VISIBLE_DEVICES; parameter servers and the chief get "
        "none), from the launcher's own CUDA_VISIBLE_DEVICES when set, else those nvidia-smi -L lists; "
        "0 (default): every process sees what the launcher sees",
    )
    p.add_argument(
        "--no-pin",
        action="store_true",
        help="do not give each process CPUs of its own (by default, when there is at least one CPU per process, "
        "each is pinned to its share, as the kubelet's static CPU manager pins a pod, and runs one thread per CPU)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """trainer-launch: runs N local workers and supervises them; returns the exit code (the contract's, `cli`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    return run_cli(lambda: _launch(build_parser().parse_args(own), rest), prefix="launch ")


def _given(rest: list[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in rest)


def _launch(args: argparse.Namespace, rest: list[str]) -> int:
    if args.max_restarts < 0:
        raise UsageError(f"max restarts {args.max_restarts} is not allowed; allowed: 0 or more")
    if not 0 <= args.grace <= 3600:
        raise UsageError(f"grace {args.grace!r} is not allowed; allowed: 0 to 3600 seconds")
    cluster, control = local_processes.local_topology(args.workers, args.ps)
    gpus = None
    if args.gpus_per_worker:
        visible, source = local_processes.visible_gpus()
        jobs = [task.job for task in tasks(cluster)]
        gpus = local_processes.gpu_assignments(jobs, args.gpus_per_worker, visible, source)
    if args.ps and "--strategy" not in rest:
        rest = [*rest, "--strategy", "parameter_server"]
    if not _given(rest, "--cluster-mode"):
        rest = [*rest, "--cluster-mode", "local"]
    if args.max_restarts:
        rest = [*rest, "--max-restarts", str(args.max_restarts)]
    if not _given(rest, "--run-id"):
        run_id = new_run_id()
        log.info("run id %s (pass --run-id %s to resume this run's checkpoints in a later launch)", run_id, run_id)
        rest = [*rest, "--run-id", run_id]
    group = local_processes.WorkerGroup(
        [sys.executable, "-m", "trainer.train", *rest],
        cluster,
        args.grace,
        tolerate=("worker",) if args.ps else (),
        control=control,
        replacements=args.max_restarts,
        pin=not args.no_pin,
        gpus=gpus,
    )

    def interrupted(signum: int, frame: object) -> None:
        group.stop()
        sys.exit(128 + signum)

    previous = {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        log.info("starting %s", json.dumps(cluster))
        group.start()
        code, label = group.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if label is not None:
        print(
            f"error: {label} failed with exit code {code}: {group.last_error.get(label, 'no error line')}",
            file=sys.stderr,
        )
        return code
    log.info("all %d processes finished", len(group.tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
