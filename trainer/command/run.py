"""Runs a user's own command as one task of a TFJob-shaped cluster, under this project's supervisor.

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

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.cluster import tf_config as cluster_lib
from trainer.cluster.record import ClusterRecord
from trainer.cluster.resume import clean_before_training
from trainer.command import tfjob
from trainer.command.exec import WORKDIR_ENV
from trainer.command.record import JobRecord, reported_metrics
from trainer.config import registry as settings
from trainer.core import cpus
from trainer.core.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, RETRYABLE_EXIT_CODES, TaskFailedError, UsageError
from trainer.core.files import write_json
from trainer.core.runs import run_key

log = logging.getLogger(__name__)

MODEL_DIR_ENV = "MODEL_DIR"
CHECKPOINT_DIR_ENV = "CHECKPOINT_DIR"
DEFAULT_SAVED_MODEL = f"$({MODEL_DIR_ENV})/saved_model"
WORKER_FILE = "worker.json"
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def create_job_cluster(
    output_dir: str,
    run_id: str,
    chief: bool,
    num_workers: int,
    cluster_mode: str,
    port: int,
    num_ps: int = 0,
    evaluator: bool = False,
) -> ClusterRecord:
    """Gives every task of a job an address and a control address and writes cluster.json (as `create_cluster`).

    The Evaluator is in the cluster of TF_CONFIG, as the operator put it there (`genClusterSpec`); its control
    address is never served or asked (it never restarts with the training tasks). The record holds a fresh secret
    for the job's control channel.
    """
    from trainer.cluster.local import free_ports
    from trainer.k8s import objects as k8s

    settings.check("cluster_mode", cluster_mode)
    settings.check("port", port)
    training = num_workers + num_ps + (1 if chief else 0)
    total = training + (1 if evaluator else 0)
    if cluster_mode == "local":
        ports = free_ports(2 * total)
        addresses = [f"localhost:{p}" for p in ports[:total]]
        control = [f"localhost:{p}" for p in ports[total:]]
    else:
        addresses = k8s.task_addresses(run_id, total, k8s.namespace(), port)
        control = [cluster_lib.next_port(a) for a in addresses]
    # assign_addresses names a lone task `worker`, and makes the first of several tasks the chief only when asked.
    cluster = cluster_lib.assign_addresses(addresses[:training], num_workers, num_ps, chief=chief)
    spec = cluster_lib.assign_addresses(control[:training], num_workers, num_ps, chief=chief)
    if chief and not num_workers and not num_ps:
        cluster, spec = {"chief": cluster["chief"]}, {"chief": spec["chief"]}
    if evaluator:
        cluster["evaluator"], spec["evaluator"] = addresses[training:], control[training:]
    record = ClusterRecord.new(cluster, spec, cluster_mode)
    record.write(output_dir)
    return record


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
        env[name] = tfjob.expand(value, env)
    # tf.keras as tf-keras (Keras 2), as TFJob-era scripts wrote it: Keras 3's fit fails under
    # MultiWorkerMirroredStrategy (keras-team/keras#20585). A replica may set it to 0.
    env.setdefault(LEGACY_KERAS_ENV, "1")
    threads = cpus.thread_counts(0, env)
    env.setdefault(cpus.INTRA_ENV, str(threads.intra))
    env.setdefault(cpus.INTER_ENV, str(threads.inter))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _checkpoint_root(checkpoint_dir: str) -> str:
    """`checkpoint_dir` when set, else a directory on the task's own disk (shared by local tasks)."""
    return checkpoint_dir.rstrip("/") or os.path.join(tempfile.gettempdir(), "tfjob-checkpoints")


def _checkpoint_dir(checkpoint_dir: str, run_id: str) -> str:
    """The command's `CHECKPOINT_DIR`: this run's own directory under the root, `ROOT/<run key>`.

    A retried or replaced task of the run finds what its command wrote there; a later run with the same
    `checkpoint_dir` starts with an empty one.
    """
    return f"{_checkpoint_root(checkpoint_dir)}/{run_key(run_id)}"


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


# A chief that is keeping its model has not written its final state yet: how long a failed peer waits for it.
FINAL_STATE_SECONDS = 10.0


def _chief_succeeded(store: Any, seconds: float) -> bool:
    """Whether the chief's status says it succeeded, waiting up to `seconds` while it says it is still running."""
    from trainer.cluster.chief import POLL_INTERVAL

    deadline = time.monotonic() + seconds
    while True:
        state = (store.read() or {}).get("state")
        if state != "running" or time.monotonic() >= deadline:
            return state == "succeeded"
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


def command_task(
    cluster_dir: str,
    task_type: str,
    index: int,
    model_dir: str,
    run_id: str,
    command: Sequence[str],
    env: Sequence[Sequence[str]] | Mapping[str, str],
    restart_policy: str,
    saved_model: str,
    image: str,
    startup_timeout: float,
    unschedulable_timeout: float,
    max_restarts: int,
    checkpoint_dir: str,
    cluster_mode: str,
    chief_timeout: float = settings.default("chief_timeout"),
    working_dir: str = "",
    success_policy: str = "",
) -> dict[str, Any]:
    """Runs `command` as task `task_type`:`index` of the run's job under the supervisor; returns the Model metadata.

    A job of one task in total gets no TF_CONFIG and waits for nothing, as under the operator (`isDistributed`).
    In a job of several, the chief publishes its status while it runs (`trainer.cluster.chief`): the ps and worker
    tasks of a parameter-server job, whose commands serve until stopped, end when it says the job is over (exit 0),
    when it failed (1) or when its heartbeat is older than `chief_timeout` (138); an Evaluator runs beside the
    training tasks and ends with the chief the same way, and its own failure never fails a job whose chief succeeded.
    Under the default success policy (and always with a Chief) a task whose command fails for good after the chief
    succeeded ends 0. Each task restarts by its replica's restart policy, as TFJob's did; a MultiWorkerMirrored
    job's tasks restart together.

    Raises:
        UsageError: a bad setting, or a chief that wrote no SavedModel; nothing was started or kept.
        TaskFailedError: the command failed for good; its exit code is kept.
    """
    from trainer.cluster.chief import ChiefWatch, StatusPublisher
    from trainer.cluster.control import PEER_POLL_SECONDS, Control
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
    if success_policy not in tfjob.SUCCESS_POLICIES:
        raise UsageError(f"success_policy {success_policy!r} is not allowed; allowed: AllWorkers or empty")
    if not command:
        raise UsageError("the command is empty; give the replica's command and args")
    if working_dir and not os.path.isabs(working_dir):
        raise UsageError(f"working_dir {working_dir!r} is not allowed; allowed: an absolute path, or empty")
    record = ClusterRecord.read(cluster_dir)
    tf_config = tfjob.tf_config(record.cluster, task_type, index)
    name = f"{task_type} {index}"
    os.makedirs(model_dir, exist_ok=True)
    environment = task_environment(os.environ, env, model_dir, _checkpoint_dir(checkpoint_dir, run_id))
    if task_type != "evaluator":
        clean_before_training(_checkpoint_root(checkpoint_dir), run_id, tf_config, remove=False)
    argv = [tfjob.expand(part, environment) for part in command]
    evaluator = task_type == "evaluator"
    training = [t for t in cluster_lib.tasks(record.cluster) if t.job != "evaluator"]
    distributed = tf_config is not None
    log.info(
        "%s runs %s with %s",
        name,
        json.dumps(argv),
        f"TF_CONFIG {json.dumps(tf_config)}" if distributed else "no TF_CONFIG (one task in all, as under TFJob)",
    )
    if cluster_mode == "kubernetes" and not checkpoint_dir and len(training) > 1 and not evaluator:
        log.warning(
            "%s: CHECKPOINT_DIR %s is on this pod's own disk: restarts in place keep it, but a lost pod's "
            "replacement starts without it and cannot resume with its peers; set checkpoint_dir (or a claim) to "
            "a location every task shares (docs/migrate-from-tfjob.md)",
            name,
            environment[CHECKPOINT_DIR_ENV],
        )
    servers = "ps" in record.cluster
    together = distributed and record.control and max_restarts and not servers and not evaluator
    training_control = {job: a for job, a in record.control.items() if job != "evaluator"}
    control = Control.of_task(training_control, tf_config, secret=record.secret) if together else None
    chief = cluster_lib.is_chief(tf_config) and not evaluator
    store = open_status(status_uri(cluster_mode, run_id), run_id) if distributed else None
    # Its clocks start at its first read, once this task has joined the cluster.
    over = (
        ChiefWatch(store, startup_timeout, chief_timeout, name).over if (servers and not chief) or evaluator else None
    )
    kubernetes = cluster_mode == "kubernetes" and distributed
    # The training tasks neither wait for the evaluator's name nor need it; the evaluator waits for theirs.
    joined = record.cluster if evaluator else {job: a for job, a in record.cluster.items() if job != "evaluator"}
    position = (
        discovery.join_cluster(joined, task_type, index, run_id, startup_timeout, unschedulable_timeout)
        if kubernetes
        else None
    )
    supervisor = Supervisor(
        [sys.executable, "-m", "trainer.command.exec", *argv],
        dict(environment, **({WORKDIR_ENV: working_dir} if working_dir else {})),
        tf_config,
        startup_timeout,
        max_restarts,
        control,
        retryable=retryable,
        formed=(lambda: True) if evaluator else lambda: not unreachable(training),
        blame_peers=True,
        over=over,
    )

    def result(code: int) -> dict[str, Any]:
        stopped = code in (EXIT_TERMINATED, EXIT_INTERRUPTED)
        chiefs = evaluator or not success_policy or "chief" in record.cluster
        if code and not stopped and store is not None and not chief and chiefs:
            code = _after_the_chief(store, code, name, evaluator, startup_timeout, chief_timeout)
        _succeed(code)
        if not chief:
            write_json(os.path.join(model_dir, WORKER_FILE), {"task": f"{task_type}:{index}", "chief": False})
            return {"task": f"{task_type}:{index}", "chief": False}
        _keep_model(model_dir, tfjob.expand(saved_model or DEFAULT_SAVED_MODEL, environment))
        metrics = reported_metrics(model_dir)
        JobRecord(run_id, f"{task_type}:{index}", tuple(argv), image, supervisor.restarts, metrics).write(model_dir)
        return {"task": f"{task_type}:{index}", "chief": True, **metrics}

    succeeded = False
    try:
        if not (store is not None and chief):
            outcome = result(supervisor.run())
            succeeded = True
            return outcome
        # The other tasks go by the chief's final state: "succeeded" once its model is kept, "failed" when it failed
        # for good. Killed, lost or stopped (a drained node), it leaves no final state: KFP's retry may bring it
        # back within chief_timeout, while the others keep waiting.
        with StatusPublisher(store) as status:
            code = supervisor.run()
            if code in RETRYABLE_EXIT_CODES:
                status.abandon()
            outcome = result(code)
            succeeded = True
            return outcome
    finally:
        if control:
            control.close(linger=2.5 * PEER_POLL_SECONDS if succeeded else 0.0)
        if kubernetes:
            discovery.leave_cluster(run_id, position)
