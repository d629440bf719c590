"""One task of a run's cluster, from the cluster record to the task record: the path every training task takes.

    cluster record -> TF_CONFIG -> join -> supervise -> leave -> task record

`run_cluster_task` is that path, for this project's trainer (`Trainer`) and for a user's own command
(`trainer.command.run.Command`) alike. What differs between them is data: the `Plan` a task's `Work` makes once it
knows its place in the cluster (`Member`) - the supervised process with its `RestartPolicy` and `Readiness`, the
control channel when it restarts together with its peers (`restarts_together`), what it serves until, the status it
publishes - and what it leaves when its process has ended (`Work.produce`: a model, or a `TaskRecord`).
`supervise` is the middle of the path alone, for a task started with a TF_CONFIG and no cluster record
(`trainer-train`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from trainer.cluster import topology
from trainer.cluster.cluster_record import ClusterRecord, TaskRecord
from trainer.cluster.control import PEER_POLL_SECONDS, SECRET_ENV, Control, check_secret
from trainer.cluster.policy import CONTRACT
from trainer.cluster.resume import CheckpointHome
from trainer.cluster.supervisor import CONFIG_ENV, SupervisedTask, Supervisor
from trainer.core.errors import TaskFailedError
from trainer.core.tasks import TaskId

log = logging.getLogger(__name__)

EVALUATOR = "evaluator"
# A supervisor whose peers ask it before blaming themselves (`Decision.ASK_PEERS`) keeps answering this long after
# its task succeeded, so that a peer failing at the same moment reads `done`, not silence (a lost peer).
SUCCESS_LINGER = 2.5 * PEER_POLL_SECONDS
T = TypeVar("T")


def restarts_together(tf_config: Mapping[str, Any] | None, max_restarts: int) -> bool:
    """Whether a task's supervisor restarts together with its peers' (through the control channel).

    A training task of a MultiWorkerMirrored cluster (no parameter servers; not the Evaluator) with restarts
    allowed: a lost peer breaks every collective, so all restart at once. A parameter-server cluster's tasks restart
    alone, and a single process has no peers.
    """
    return bool(
        tf_config and max_restarts and "ps" not in tf_config["cluster"] and tf_config["task"]["type"] != EVALUATOR
    )


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a task runs: its cluster record, its place in the cluster, and how it joins.

    Attributes:
        environment: TF_CONFIG's `environment` key (`cloud`, as TFJob's operator set it); None: no such key.
        alone_undistributed: a job of one task in all gets no TF_CONFIG (TFJob's operator, `isDistributed`).
    """

    cluster_dir: str
    job: str
    index: int
    run_id: str
    cluster_mode: str
    startup_timeout: float
    unschedulable_timeout: float
    environment: str | None = None
    alone_undistributed: bool = False


@dataclasses.dataclass(frozen=True)
class Member:
    """A task that knows its place: its TF_CONFIG (None: one process) and its supervisors' control addresses.

    Attributes:
        control: the supervisors' control addresses, shaped like the cluster (empty: none).
        secret: the run's control secret (empty: `TRAINER_CONTROL_SECRET` of the process's environment).
    """

    job: str
    index: int
    tf_config: dict[str, Any] | None
    control: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    secret: str = dataclasses.field(default="", repr=False)

    @classmethod
    def of_record(cls, record: ClusterRecord, placement: Placement) -> Member:
        """The task `placement` names in the run's cluster record, its TF_CONFIG built (and checked) from it."""
        tf_config: dict[str, Any] | None = topology.build_tf_config(
            record.cluster, placement.job, placement.index, placement.environment
        )
        if placement.alone_undistributed and len(topology.task_order(record.cluster)) == 1:
            tf_config = None
        return cls(placement.job, placement.index, tf_config, record.control, record.secret)

    @classmethod
    def of_tf_config(cls, tf_config: dict[str, Any], control: Mapping[str, Sequence[str]]) -> Member:
        """The task a TF_CONFIG names (`trainer-train`), with its supervisors' control addresses."""
        task = tf_config["task"]
        return cls(task["type"], task["index"], tf_config, control)

    @property
    def name(self) -> str:
        """`worker 1`: as log lines and errors name the task."""
        return TaskId(self.job, self.index).name

    @property
    def label(self) -> str:
        """`worker:1`: as records and metadata name the task."""
        return TaskId(self.job, self.index).label

    @property
    def evaluator(self) -> bool:
        """Whether this is the Evaluator, beside the training cluster."""
        return self.job == EVALUATOR

    @property
    def chief(self) -> bool:
        """Whether this is the chief (TensorFlow's rule; a single process is), the one task that keeps the model."""
        return topology.is_chief(self.tf_config) and not self.evaluator

    @property
    def parameter_servers(self) -> bool:
        """Whether the cluster has parameter servers."""
        return bool(self.tf_config) and "ps" in self.tf_config["cluster"]

    @property
    def joined(self) -> dict[str, list[str]]:
        """The cluster this task waits for: the training tasks neither wait for the Evaluator's name nor need it."""
        cluster = self.tf_config["cluster"] if self.tf_config else {}
        return {job: a for job, a in cluster.items() if job != EVALUATOR or self.evaluator}

    def channel(self, max_restarts: int, env: dict[str, str], home: CheckpointHome | None = None) -> Control | None:
        """The control channel of this task's supervisor when it restarts together with its peers, else None.

        The secret is the run's (the record's), else `TRAINER_CONTROL_SECRET` of `env`; either way it is taken out
        of `env`, which the task's process gets.

        Raises:
            UsageError: the channel is needed and no secret of the run is given.
        """
        secret = self.secret or env.get(SECRET_ENV, "")
        env.pop(SECRET_ENV, None)
        if not (self.control and self.tf_config and restarts_together(self.tf_config, max_restarts)):
            return None
        secret = check_secret(secret, f"the environment variable {SECRET_ENV}")
        training = {job: a for job, a in self.control.items() if job != EVALUATOR}
        if home is None:
            return Control.of_task(training, self.tf_config, secret=secret)
        return Control.of_task(training, self.tf_config, home.epoch, home.send, secret=secret)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a member runs: the supervised process, and what its supervisor works with.

    Attributes:
        task: the process and its rules.
        control: the control channel, when the task restarts together with its peers.
        home: the task's checkpoints, handed over between supervisors.
        status: the run's chief status store (`trainer.cluster.status`), when the other tasks go by the chief's.
        publishes: this task is the chief and publishes its status there while it runs: "succeeded" once what it
            leaves is produced, "failed" when it failed for good.
    """

    task: SupervisedTask
    control: Control | None = None
    home: CheckpointHome | None = None
    status: Any = None
    publishes: bool = False


class Work(Protocol):
    """What a task does in the lifecycle: plan its supervised process, and produce what it leaves."""

    def plan(self, member: Member) -> Plan:
        """The supervised process for this member (nothing started yet but its control channel)."""
        ...

    def produce(self, member: Member, plan: Plan, code: int, restarts: int) -> dict[str, Any]:
        """What the task leaves once its process ended with `code`: the metadata of its Model artifact.

        Raises:
            TaskFailedError: the task failed; its exit code is kept.
        """
        ...


def run_cluster_task(placement: Placement, work: Work) -> dict[str, Any]:
    """Runs one task of the run's cluster: cluster record -> TF_CONFIG -> join -> supervise -> leave -> task record.

    In Kubernetes mode a distributed task creates its Service and waits for its peers' names first
    (`trainer.cluster.discovery`) and deletes its Service at the end, whatever the outcome.

    Returns:
        What `work` produced: the metadata of the task's Model artifact.

    Raises:
        UsageError: the cluster record or the task's place in it is not valid; nothing was started.
        TaskFailedError: the task failed; its exit code is kept.
    """
    from trainer.cluster import discovery

    record = ClusterRecord.read(placement.cluster_dir)
    member = Member.of_record(record, placement)
    log.info("%s joins the cluster %s", member.name, json.dumps(record.cluster))
    plan = work.plan(member)
    kubernetes = placement.cluster_mode == "kubernetes" and member.tf_config is not None
    try:
        position = (
            discovery.join_cluster(
                member.joined,
                member.job,
                member.index,
                placement.run_id,
                placement.startup_timeout,
                placement.unschedulable_timeout,
            )
            if kubernetes
            else None
        )
    except BaseException:
        if plan.control:
            plan.control.close()
        raise
    try:
        return _supervised(plan, lambda code, restarts: work.produce(member, plan, code, restarts))
    finally:
        if kubernetes:
            discovery.leave_cluster(placement.run_id, position)


def supervise(member: Member, work: Work) -> int:
    """The middle of the path alone, for a task with a TF_CONFIG and no cluster record: its exit code."""
    return _supervised(work.plan(member), lambda code, restarts: code)


def _supervised(plan: Plan, produce: Callable[[int, int], T]) -> T:
    """Supervises the plan's process and produces what it leaves; the chief's status published meanwhile.

    The chief's final status is "succeeded" once what it leaves is produced, "failed" when it failed for good.
    Killed, lost or stopped (a drained node), it leaves none: a retry may bring it back within the servers'
    `chief_timeout`, while they keep waiting.
    """
    from trainer.cluster.chief import StatusPublisher

    succeeded = False
    supervisor = Supervisor(plan.task, plan.control, plan.home)
    try:
        if not plan.publishes:
            outcome = produce(supervisor.run(), supervisor.restarts)
        else:
            with StatusPublisher(plan.status) as status:
                code = supervisor.run()
                if CONTRACT.retries(code):
                    status.abandon()
                outcome = produce(code, supervisor.restarts)
        succeeded = True
        return outcome
    finally:
        if plan.control:
            plan.control.close(linger=SUCCESS_LINGER if succeeded and plan.task.restart.blame_peers else 0.0)


@dataclasses.dataclass(frozen=True)
class Trainer:
    """This project's training process (`trainer.training.task`) as a task's work.

    Attributes:
        config: the task's training config (handed to the process as JSON).
        env: the process's environment (default: this process's).
    """

    config: Any
    env: Mapping[str, str] | None = None

    def plan(self, member: Member) -> Plan:
        """The training process under the contract's restart policy; with restarts together, its checkpoint home."""
        from trainer.cluster.resume import checkpoint_root, clean_before_training, home_for

        config = self.config
        clean_before_training(checkpoint_root(config), config.runtime.run_id, member.tf_config)
        env = dict(os.environ if self.env is None else self.env, **{CONFIG_ENV: json.dumps(config.to_dict())})
        max_restarts = config.cluster.max_restarts
        home = home_for(config, member.tf_config) if restarts_together(member.tf_config, max_restarts) else None
        control = member.channel(max_restarts, env, home)
        task = SupervisedTask(
            (sys.executable, "-m", "trainer.training.task"),
            env,
            member.tf_config,
            config.cluster.startup_timeout,
            CONTRACT.limited(max_restarts),
        )
        return Plan(task, control, home if control else None)

    def produce(self, member: Member, plan: Plan, code: int, restarts: int) -> dict[str, Any]:
        """The task's metadata; a task that is not the chief leaves its `TaskRecord` (the chief, the model)."""
        if code:
            raise TaskFailedError(code)
        if not member.chief:
            TaskRecord.of(member.job, member.index).write(self.config.runtime.model_dir)
        return {
            "task": member.label,
            "chief": member.chief,
            "strategy": self.config.cluster.strategy,
            "framework": "tensorflow",
        }


def status_location(status_uri: str, cluster_mode: str, run_id: str, model_dir: str = "") -> str:
    """Where the chief of a run with parameter servers keeps its status: the one default, always the run's own.

    Under `status_uri` when set (`trainer.core.runs.run_status_uri`); else the run's ConfigMap in Kubernetes mode;
    else a file beside the model directory the tasks share, `MODEL_DIR.status/<run key>.json` (a later run into the
    same MODEL_DIR never reads it); else (a user's command: every task has its own) a file of the run in this
    machine's temporary directory, which local tasks share.
    """
    import tempfile

    from trainer.core.runs import run_key, run_status_uri

    if status_uri:
        return run_status_uri(status_uri, run_id)
    if cluster_mode == "kubernetes":
        from trainer.cluster.configmap_status import configmap_name
        from trainer.cluster.status import CONFIGMAP

        return CONFIGMAP + configmap_name(run_id)
    if model_dir:
        return f"{model_dir.rstrip('/')}.status/{run_key(run_id)}.json"
    return os.path.join(tempfile.gettempdir(), "tfjob-status", f"{run_key(run_id)}.json")
