"""Runs a user's own command as one task of a TFJob-shaped cluster, under this project's supervisor.

`Command` is the task's work in the one task lifecycle (`trainer.cluster.lifecycle`), which this project's trainer
goes through as well; the pipeline's step is `trainer.steps.command_task`.

The task gets what TFJob gave it (TF_CONFIG as the operator built it, restarts by its replica's `restartPolicy`) and
what this project adds: a Service per task and peer waits that name what is missing (Kubernetes mode), a start-up
watchdog, prompt cancel on SIGTERM, restarts in place that every worker makes together (the control channel), and
TensorFlow threads sized to the pod's CPU. Its environment also names where to write:

- `MODEL_DIR`: this task's model directory (the step's Model artifact); the chief's SavedModel goes to
  `saved_model` (default `$(MODEL_DIR)/saved_model`), and a `$(MODEL_DIR)/metrics.json` of numbers is recorded and
  used by publishing;
- `CHECKPOINT_DIR`: this run's own directory, `ROOT/<run key>`, under `checkpoint_dir` when set (a claim or a bucket
  every task shares), else under a directory on the task's own disk (kept across restarts in place, not across a
  lost pod; docs/migrate-from-tfjob.md). A later run with the same `checkpoint_dir` gets a directory of its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trainer import LEGACY_KERAS_ENV
from trainer.cluster import topology
from trainer.cluster.cluster_record import TaskRecord
from trainer.cluster.lifecycle import Member, Plan, status_location
from trainer.cluster.policy import Readiness
from trainer.cluster.resume import clean_before_training, root_of
from trainer.cluster.status import ChiefState
from trainer.cluster.supervisor import SupervisedTask
from trainer.command import tfjob_spec
from trainer.command.exec import WORKDIR_ENV
from trainer.config import settings
from trainer.core import cpus
from trainer.core.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, TaskFailedError, UsageError
from trainer.core.runs import run_key
from trainer.records.job import JobRecord, reported_metrics

log = logging.getLogger(__name__)

MODEL_DIR_ENV = "MODEL_DIR"
CHECKPOINT_DIR_ENV = "CHECKPOINT_DIR"
DEFAULT_SAVED_MODEL = f"$({MODEL_DIR_ENV})/saved_model"
EXEC = (sys.executable, "-m", "trainer.command.exec")


def task_environment(
    base: Mapping[str, str], user: Sequence[Sequence[str]] | Mapping[str, str], model_dir: str, checkpoint_dir: str
) -> dict[str, str]:
    """The command's environment, in the order a pod builds it.

    `base`, then `MODEL_DIR` and `CHECKPOINT_DIR`, then the replica's own variables in the manifest's order (each may
    use `$(NAME)` of those before it, as Kubernetes expands them), then `TF_USE_LEGACY_KERAS=1` and TensorFlow's thread
    counts sized to the CPU unless the replica set them.
    """
    env = dict(base)
    env[MODEL_DIR_ENV] = model_dir
    env[CHECKPOINT_DIR_ENV] = checkpoint_dir
    for name, value in user.items() if isinstance(user, Mapping) else user:
        env[name] = tfjob_spec.expand(value, env)
    # tf.keras as tf-keras (Keras 2), as TFJob-era scripts wrote it: Keras 3's fit fails under
    # MultiWorkerMirroredStrategy (keras-team/keras#20585). A replica may set it to 0.
    env.setdefault(LEGACY_KERAS_ENV, "1")
    threads = cpus.thread_counts(0, env)
    env.setdefault(cpus.INTRA_ENV, str(threads.intra))
    env.setdefault(cpus.INTER_ENV, str(threads.inter))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The command's `CHECKPOINT_DIR`: this run's own directory under the root, `ROOT/<run key>`.

    A retried or replaced task of the run finds what its command wrote there; a later run with the same
    `checkpoint_dir` starts with an empty one.
    """
    return f"{root_of(checkpoint_dir)}/{run_key(run_id)}"


def _keep_model(model_dir: str, saved_model: str) -> None:
    """Puts the chief's SavedModel at MODEL_DIR/saved_model, where evaluation, publishing and serving read it."""
    target = os.path.join(model_dir, "saved_model")
    if not os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
        raise UsageError(
            f"the chief finished but wrote no SavedModel at {saved_model!r} (saved_model.pb is missing); write it "
            f"there, or to $({MODEL_DIR_ENV})/saved_model"
        )
    if os.path.realpath(saved_model) != os.path.realpath(target):
        shutil.copytree(saved_model, target, dirs_exist_ok=True)


# A chief that is keeping its model has not written its final state yet: how long a failed peer waits for it.
FINAL_STATE_SECONDS = 10.0


def _chief_succeeded(store: Any, seconds: float) -> bool:
    """Whether the chief's status says it succeeded, waiting up to `seconds` while it says it is still running."""
    from trainer.cluster.chief import POLL_INTERVAL

    deadline = time.monotonic() + seconds
    while True:
        status = store.read_status()
        if status is None or status.state.is_terminal or time.monotonic() >= deadline:
            return status is not None and status.state is ChiefState.SUCCEEDED
        time.sleep(POLL_INTERVAL)


def _after_the_chief(store: Any, code: int, name: str, evaluator: bool, startup_timeout: float, timeout: float) -> int:
    """A task whose command failed for good while the job's success is the chief's: 0 once the chief succeeded.

    TFJob's success policy (`UpdateJobStatus`): a job with a Chief succeeds when the Chief does, one without it when
    worker 0 does (the chief here) unless AllWorkers; a task failing after that does not fail it. An Evaluator never
    fails a job that succeeded, so it waits for the chief's final state; a training task waits while the chief
    is still keeping its model (`FINAL_STATE_SECONDS`).
    """
    from trainer.cluster.chief import wait_for_chief

    try:
        if evaluator:
            wait_for_chief(store, startup_timeout, timeout, name)
        elif not _chief_succeeded(store, FINAL_STATE_SECONDS):
            return code
    except Exception as err:  # noqa: BLE001 - the chief failed or vanished: this task's own failure stands
        log.info("%s: %s", name, err)
        return code
    print(
        f"warning: {name}: its command exited with code {code} after the chief succeeded; the job succeeded with "
        "its chief (TFJob's success policy), so this task ends 0",
        file=sys.stderr,
        flush=True,
    )
    return 0


@dataclasses.dataclass(frozen=True)
class Command:
    """A user's command as one task of a TFJob-shaped job: what the task's work is in the lifecycle.

    A job of one task in total gets no TF_CONFIG and waits for nothing, as under the operator (`isDistributed`).
    In a job of several, the chief publishes its status while it runs (`trainer.cluster.chief`): the ps and worker
    tasks of a parameter-server job, whose commands serve until stopped, end when it says the job is over (exit 0),
    when it failed (1) or when its heartbeat is older than `chief_timeout` (138); an Evaluator runs beside the
    training tasks and ends with the chief the same way, and its own failure never fails a job whose chief succeeded.
    Under the default success policy (and always with a Chief) a task whose command fails for good after the chief
    succeeded ends 0. Each task restarts by its replica's restart policy, as TFJob's did; a MultiWorkerMirrored
    job's tasks restart together.

    Attributes:
        command: the replica's command and args; `$(NAME)` is expanded from the environment as in a pod.
        env: the replica's environment variables in the manifest's order (`task_environment`).
        model_dir: this task's model directory (`MODEL_DIR`).
        run_id: the pipeline run's id.
        restart_policy: the replica's TFJob restartPolicy (`tfjob.RESTART_POLICIES`).
        saved_model: where the chief's command writes its SavedModel (empty: `$(MODEL_DIR)/saved_model`).
        image: the replica's image, recorded in the model's lineage.
        startup_timeout: seconds the cluster may take to form.
        max_restarts: restarts in place by the restart policy.
        checkpoint_dir: the root of `CHECKPOINT_DIR` (empty: the task's own disk).
        cluster_mode: kubernetes or local.
        chief_timeout: seconds the servers keep serving after the chief's heartbeat stops.
        working_dir: the directory the command runs in (empty: the image's).
        success_policy: the TFJob's successPolicy: empty (the chief's success is the job's) or AllWorkers.
    """

    command: Sequence[str]
    env: Sequence[Sequence[str]] | Mapping[str, str]
    model_dir: str
    run_id: str
    restart_policy: str
    saved_model: str
    image: str
    startup_timeout: float
    max_restarts: int
    checkpoint_dir: str
    cluster_mode: str
    chief_timeout: float = settings.default("chief_timeout")
    working_dir: str = ""
    success_policy: str = ""

    def check(self) -> None:
        """Refuses a bad setting before anything is read or started.

        Raises:
            UsageError: one line naming the value and what is allowed.
        """
        for name in ("startup_timeout", "max_restarts", "checkpoint_dir", "cluster_mode", "chief_timeout"):
            settings.check(name, getattr(self, name))
        tfjob_spec.restart_policy(self.restart_policy)
        if self.success_policy not in tfjob_spec.SUCCESS_POLICIES:
            raise UsageError(f"success_policy {self.success_policy!r} is not allowed; allowed: AllWorkers or empty")
        if not self.command:
            raise UsageError("the command is empty; give the replica's command and args")
        if self.working_dir and not os.path.isabs(self.working_dir):
            raise UsageError(f"working_dir {self.working_dir!r} is not allowed; allowed: an absolute path, or empty")

    def plan(self, member: Member) -> Plan:
        """The command under the supervisor: its environment, restart policy, readiness and what it serves until."""
        from trainer.cluster.chief import ChiefWatch, open_status

        tf_config, name = member.tf_config, member.name
        os.makedirs(self.model_dir, exist_ok=True)
        environment = task_environment(
            os.environ, self.env, self.model_dir, _checkpoint_dir(self.checkpoint_dir, self.run_id)
        )
        if not member.evaluator:
            clean_before_training(root_of(self.checkpoint_dir), self.run_id, tf_config, remove=False)
        argv = [tfjob_spec.expand(part, environment) for part in self.command]
        log.info(
            "%s runs %s with %s",
            name,
            json.dumps(argv),
            f"TF_CONFIG {json.dumps(tf_config)}" if tf_config else "no TF_CONFIG (one task in all, as under TFJob)",
        )
        training = [t for t in topology.tasks(tf_config["cluster"]) if t.job != "evaluator"] if tf_config else []
        if self.cluster_mode == "kubernetes" and not self.checkpoint_dir and len(training) > 1 and not member.evaluator:
            log.warning(
                "%s: CHECKPOINT_DIR %s is on this pod's own disk: restarts in place keep it, but a lost pod's "
                "replacement starts without it and cannot resume with its peers; set checkpoint_dir (or a claim) to "
                "a location every task shares (docs/migrate-from-tfjob.md)",
                name,
                environment[CHECKPOINT_DIR_ENV],
            )
        store = open_status(status_location("", self.cluster_mode, self.run_id), self.run_id) if tf_config else None
        # Its clocks start at its first read, once this task has joined the cluster.
        serves = (member.parameter_servers and not member.chief) or member.evaluator
        task = SupervisedTask(
            (*EXEC, *argv),
            dict(environment, **({WORKDIR_ENV: self.working_dir} if self.working_dir else {})),
            tf_config,
            self.startup_timeout,
            tfjob_spec.restart_policy(self.restart_policy).limited(self.max_restarts),
            Readiness.AT_START if member.evaluator else Readiness.PROBED,
            ChiefWatch(store, self.startup_timeout, self.chief_timeout, name) if serves else None,
        )
        control = member.channel(self.max_restarts, environment)
        return Plan(task, control, status=store, publishes=store is not None and member.chief)

    def produce(self, member: Member, plan: Plan, code: int, restarts: int) -> dict[str, Any]:
        """The chief keeps its model and writes job.json; any other task its `TaskRecord`.

        Raises:
            UsageError: the chief wrote no SavedModel.
            TaskFailedError: the command failed for good (it wrote its own `error:` line); its exit code is kept.
        """
        stopped = code in (EXIT_TERMINATED, EXIT_INTERRUPTED)
        if code and not stopped and plan.status is not None and not member.chief:
            chiefs = member.evaluator or not self.success_policy or "chief" in member.tf_config["cluster"]
            if chiefs:
                code = _after_the_chief(
                    plan.status, code, member.name, member.evaluator, self.startup_timeout, self.chief_timeout
                )
        if code:
            raise TaskFailedError(code)
        if not member.chief:
            record = TaskRecord.of(member.job, member.index)
            record.write(self.model_dir)
            return record.to_json()
        _keep_model(self.model_dir, tfjob_spec.expand(self.saved_model or DEFAULT_SAVED_MODEL, plan.task.env))
        metrics = reported_metrics(self.model_dir)
        argv = tuple(plan.task.command[len(EXEC) :])
        JobRecord(self.run_id, member.label, argv, self.image, restarts, metrics).write(self.model_dir)
        return {"task": member.label, "chief": True, **metrics}
