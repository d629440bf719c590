"""Runs a user's own command as one task of a TFJob-shaped cluster, under this project's supervisor.

The task gets what TFJob gave it (TF_CONFIG as the operator built it, restarts by its replica's `restartPolicy`) and
what this project adds: a Service per task and peer waits that name what is missing (Kubernetes mode), a start-up
watchdog, prompt cancel on SIGTERM, restarts in place that every worker makes together (the control channel), and
TensorFlow threads sized to the pod's CPU. Its environment also names where to write:

- `MODEL_DIR`: this task's model directory (the step's Model artifact); the chief's SavedModel goes to
  `saved_model` (default `$(MODEL_DIR)/saved_model`), and a `$(MODEL_DIR)/metrics.json` of numbers is recorded and
  used by publishing;
- `CHECKPOINT_DIR`: `checkpoint_dir` when set (a claim or a bucket every task shares), else a directory on the
  task's own disk (kept across restarts in place, not across a lost pod; docs/migrate-from-tfjob.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.cluster import tf_config as cluster_lib
from trainer.cluster.record import ClusterRecord
from trainer.command import tfjob
from trainer.command.record import JobRecord, reported_metrics
from trainer.config import registry as settings
from trainer.core import cpus
from trainer.core.errors import RETRYABLE_EXIT_CODES, TaskFailedError, UsageError
from trainer.core.files import write_json

log = logging.getLogger(__name__)

MODEL_DIR_ENV = "MODEL_DIR"
CHECKPOINT_DIR_ENV = "CHECKPOINT_DIR"
DEFAULT_SAVED_MODEL = f"$({MODEL_DIR_ENV})/saved_model"
WORKER_FILE = "worker.json"
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def create_job_cluster(
    output_dir: str, run_id: str, chief: bool, num_workers: int, cluster_mode: str, port: int, num_ps: int = 0
) -> ClusterRecord:
    """Gives every task of a job an address and a control address and writes cluster.json (as `create_cluster`)."""
    from trainer.cluster.local import free_ports
    from trainer.k8s import objects as k8s

    settings.check("cluster_mode", cluster_mode)
    settings.check("port", port)
    total = num_workers + num_ps + (1 if chief else 0)
    if cluster_mode == "local":
        ports = free_ports(2 * total)
        addresses = [f"localhost:{p}" for p in ports[:total]]
        control = [f"localhost:{p}" for p in ports[total:]]
    else:
        addresses = k8s.task_addresses(run_id, total, k8s.namespace(), port)
        control = [cluster_lib.next_port(a) for a in addresses]
    record = ClusterRecord(
        cluster_lib.assign_addresses(addresses, num_workers, num_ps, chief=chief),
        cluster_lib.assign_addresses(control, num_workers, num_ps, chief=chief),
        cluster_mode,
    )
    record.write(output_dir)
    return record


def task_environment(
    base: Mapping[str, str], user: Mapping[str, str], model_dir: str, checkpoint_dir: str
) -> dict[str, str]:
    """The command's environment, in the order a pod builds it.

    `base`, then `MODEL_DIR` and `CHECKPOINT_DIR`, then the replica's own variables (each may use `$(NAME)` of those
    before it), then `TF_USE_LEGACY_KERAS=1` and TensorFlow's thread counts sized to the CPU unless the replica set
    them.
    """
    env = dict(base)
    env[MODEL_DIR_ENV] = model_dir
    env[CHECKPOINT_DIR_ENV] = checkpoint_dir
    for name, value in user.items():
        env[name] = tfjob.expand(value, env)
    # tf.keras as tf-keras (Keras 2), as TFJob-era scripts wrote it: Keras 3's fit fails under
    # MultiWorkerMirroredStrategy (keras-team/keras#20585). A replica may set it to 0.
    env.setdefault(LEGACY_KERAS_ENV, "1")
    threads = cpus.thread_counts(0, env)
    env.setdefault(cpus.INTRA_ENV, str(threads.intra))
    env.setdefault(cpus.INTER_ENV, str(threads.inter))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """`checkpoint_dir` when set, else this run's directory on the task's own disk (shared by local tasks)."""
    from trainer.k8s import objects as k8s

    if checkpoint_dir:
        return checkpoint_dir
    return os.path.join(tempfile.gettempdir(), "tfjob-checkpoints", k8s.run_key(run_id))


def status_uri(cluster_mode: str, run_id: str) -> str:
    """Where the chief of a job with parameter servers keeps its status.

    A ConfigMap of the run in Kubernetes mode, else a file of the run on this machine (local tasks share its disk).
    """
    from trainer.k8s import objects as k8s
    from trainer.k8s import status as configmap_status
    from trainer.storage import status

    if cluster_mode == "kubernetes":
        return status.CONFIGMAP + configmap_status.configmap_name(run_id)
    return os.path.join(tempfile.gettempdir(), "tfjob-status", f"{k8s.run_key(run_id)}.json")


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


def _succeed(code: int) -> None:
    """Raises TaskFailedError for a failed supervised command (it wrote its own `error:` line)."""
    if code:
        raise TaskFailedError(code)


def command_task(
    cluster_dir: str,
    task_type: str,
    index: int,
    model_dir: str,
    run_id: str,
    command: Sequence[str],
    env: Mapping[str, str],
    restart_policy: str,
    saved_model: str,
    image: str,
    startup_timeout: float,
    unschedulable_timeout: float,
    max_restarts: int,
    checkpoint_dir: str,
    cluster_mode: str,
    chief_timeout: float = settings.default("chief_timeout"),
) -> dict[str, Any]:
    """Runs `command` as task `task_type`:`index` of the run's job under the supervisor; returns the Model metadata.

    In a job with parameter servers the chief publishes its status while it runs (`trainer.cluster.chief`); the ps
    and worker tasks, whose commands serve until stopped, end when it says the job is over (exit 0), when it failed
    (1) or when its heartbeat is older than `chief_timeout` (138). Each task restarts alone by its restart policy,
    as TFJob's did; a MultiWorkerMirrored job's tasks restart together.

    Raises:
        UsageError: a bad setting, or a chief that wrote no SavedModel; nothing was started or kept.
        TaskFailedError: the command failed for good; its exit code is kept.
    """
    from trainer.cluster.chief import ChiefWatch, StatusPublisher
    from trainer.cluster.control import Control
    from trainer.cluster.peers import unreachable
    from trainer.cluster.supervisor import Supervisor
    from trainer.k8s import discovery
    from trainer.storage.status import open_status

    for name, value in (
        ("startup_timeout", startup_timeout),
        ("unschedulable_timeout", unschedulable_timeout),
        ("max_restarts", max_restarts),
        ("checkpoint_dir", checkpoint_dir),
        ("cluster_mode", cluster_mode),
        ("chief_timeout", chief_timeout),
    ):
        settings.check(name, value)
    retryable = tfjob.retryable(restart_policy)
    if not command:
        raise UsageError("the command is empty; give the replica's command and args")
    record = ClusterRecord.read(cluster_dir)
    tf_config = tfjob.tf_config(record.cluster, task_type, index)
    name = f"{task_type} {index}"
    os.makedirs(model_dir, exist_ok=True)
    environment = task_environment(os.environ, env, model_dir, _checkpoint_dir(checkpoint_dir, run_id))
    argv = [tfjob.expand(part, environment) for part in command]
    everyone = cluster_lib.tasks(record.cluster)
    log.info("%s runs %s with TF_CONFIG %s", name, json.dumps(argv), json.dumps(tf_config))
    if cluster_mode == "kubernetes" and not checkpoint_dir and len(everyone) > 1:
        log.warning(
            "%s: CHECKPOINT_DIR %s is on this pod's own disk: restarts in place keep it, but a lost pod's "
            "replacement starts without it and cannot resume with its peers; set checkpoint_dir (or a claim) to "
            "a location every task shares (docs/migrate-from-tfjob.md)",
            name,
            environment[CHECKPOINT_DIR_ENV],
        )
    servers = "ps" in record.cluster
    together = record.control and max_restarts and not servers
    control = Control.of_task(record.control, tf_config) if together else None
    chief = cluster_lib.is_chief(tf_config)
    store = open_status(status_uri(cluster_mode, run_id), run_id) if servers else None
    # Its clocks start at its first read, once this task has joined the cluster.
    over = ChiefWatch(store, startup_timeout, chief_timeout, name).over if servers and not chief else None
    kubernetes = cluster_mode == "kubernetes"
    position = (
        discovery.join_cluster(record.cluster, task_type, index, run_id, startup_timeout, unschedulable_timeout)
        if kubernetes
        else None
    )
    supervisor = Supervisor(
        [sys.executable, "-m", "trainer.command.exec", *argv],
        environment,
        tf_config,
        startup_timeout,
        max_restarts,
        control,
        retryable=retryable,
        formed=lambda: not unreachable(everyone),
        blame_peers=True,
        over=over,
    )

    def result(code: int) -> dict[str, Any]:
        _succeed(code)
        if not chief:
            write_json(os.path.join(model_dir, WORKER_FILE), {"task": f"{task_type}:{index}", "chief": False})
            return {"task": f"{task_type}:{index}", "chief": False}
        _keep_model(model_dir, tfjob.expand(saved_model or DEFAULT_SAVED_MODEL, environment))
        metrics = reported_metrics(model_dir)
        JobRecord(run_id, f"{task_type}:{index}", tuple(argv), image, supervisor.restarts, metrics).write(model_dir)
        return {"task": f"{task_type}:{index}", "chief": True, **metrics}

    try:
        if not (servers and chief):
            return result(supervisor.run())
        # The servers end with the chief's final state: "succeeded" once its model is kept, "failed" when it failed
        # for good. Killed, lost or stopped (a drained node), it leaves no final state: KFP's retry may bring it
        # back within chief_timeout, while the servers keep serving.
        with StatusPublisher(store) as status:
            code = supervisor.run()
            if code in RETRYABLE_EXIT_CODES:
                status.abandon()
            return result(code)
    finally:
        if control:
            control.close()
        if kubernetes:
            discovery.leave_cluster(run_id, position)
