"""Parameter-server training: the chief coordinates, parameter servers hold the variables, workers run steps.

Parameter servers and workers only run a `tf.distribute.Server`; nothing in TensorFlow tells them the job is over.
So the chief publishes a small status document (`--status-uri`: a ConfigMap of the run on Kubernetes, a local file
for the launcher, or an s3:// or gs:// object; see `trainer.cluster.status`) and refreshes it every `STATUS_INTERVAL`
seconds:

    {"state": "running" | "succeeded" | "failed", "heartbeat": <unix time>, "detail": "..."}

Servers poll it: `succeeded` -> exit 0; `failed` -> exit 1; no status after `--startup-timeout`, or a heartbeat
older than `--chief-timeout` (the chief vanished) -> exit 138 (retryable). A lost worker does not stop training:
the chief's ClusterCoordinator reschedules its steps on the others.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from trainer.cluster import topology
from trainer.cluster.chief import StatusPublisher, open_status, wait_for_chief
from trainer.cluster.peers import lost_peer_message
from trainer.cluster.status import StatusStore
from trainer.config.contract import TrainConfig
from trainer.core.errors import PeerUnavailableError, UsageError
from trainer.core.tasks import TaskId
from trainer.data.inputs import ps_dataset_creator
from trainer.data.streamed import check_graph_readable
from trainer.data.tfrecords import shard_place
from trainer.modeling.export import save_model
from trainer.records.history import History, of_run
from trainer.training import setup

log = logging.getLogger(__name__)


def check_topology(tf_config: dict[str, Any] | None, config: TrainConfig | None = None) -> None:
    """Refuses a cluster this strategy cannot run: jobs, settings it ignores, a status no task reaches.

    The status is checked once the run has its id (`trainer.train.run` refuses a task of a cluster without one).
    """
    if config is not None and config.optim.validate:
        raise UsageError(
            "validate true is not allowed with the parameter_server strategy: its chief only coordinates steps and "
            "holds no copy of the test data; allowed: validate false (the evaluate step runs after training)"
        )
    if config is not None and config.model.mixed_precision:
        raise UsageError(
            f"mixed_precision {config.model.mixed_precision!r} is not allowed with the parameter_server strategy; "
            "allowed: empty (float32), or the multi_worker_mirrored strategy on workers with GPUs"
        )
    if (
        not tf_config
        or not tf_config["cluster"].get("chief")
        or not tf_config["cluster"].get("ps")
        or not tf_config["cluster"].get("worker")
    ):
        raise UsageError(
            "parameter_server strategy needs a TF_CONFIG with one chief, at least one ps and at least one worker; "
            f"got jobs {sorted(tf_config['cluster']) if tf_config else 'none (no TF_CONFIG)'}"
        )
    if config is not None and config.runtime.run_id:
        check_status_reachable(config)


def check_status_reachable(config: TrainConfig) -> None:
    """Refuses a run whose default status location is the run's ConfigMap when this process is not in a pod.

    With `status_uri` empty, `cluster_mode` kubernetes puts the status on a ConfigMap of the pod's namespace; outside
    a pod (no POD_NAMESPACE, no service-account namespace file) no task could read or write it.
    """
    from trainer.cluster.status import CONFIGMAP
    from trainer.k8s import objects

    uri = status_uri(config)
    if not config.runtime.status_uri and uri.startswith(CONFIGMAP) and objects.namespace_if_pod() is None:
        raise UsageError(
            f"cluster_mode 'kubernetes' keeps the parameter-server status on ConfigMap {uri[len(CONFIGMAP) :]!r} of "
            "the pod's namespace, but this is not a pod (POD_NAMESPACE is not set); allowed: --cluster-mode local "
            "(tasks on this machine: a file beside the model directory), --status-uri with a path, s3:// or gs:// "
            "location every task reads, or POD_NAMESPACE set with a KUBECONFIG"
        )


def run_server(config: TrainConfig, tf_config: dict[str, Any], on_started: Callable[[], None] | None = None) -> None:
    """Runs this ps or worker task's server until the chief's status says the job is over (see `wait_for_chief`)."""
    import tensorflow as tf

    task = TaskId.of(tf_config)
    what = task.name
    tf.distribute.Server(
        tf.train.ClusterSpec(tf_config["cluster"]),
        job_name=task.type,
        task_index=task.index,
        protocol="grpc",
        start=True,
    )
    if on_started:
        on_started()
    log.info(
        "%s: server started at %s (pid %d); waiting for the chief",
        what,
        topology.own_address(tf_config),
        os.getpid(),
    )
    wait_for_chief(status_store(config), config.cluster.startup_timeout, config.cluster.chief_timeout, what)


def run(
    config: TrainConfig,
    tf_config: dict[str, Any],
    *,
    datasets: Any = None,
    strategy: Any = None,
    on_formed: Callable[[], None] | None = None,
) -> History:
    """The chief: coordinates training under ParameterServerStrategy and exports the model like the mirrored runner.

    Args:
        config: the checked training configuration.
        tf_config: the chief's TF_CONFIG as a dict, with chief, ps and worker jobs.
        datasets: optional `DatasetCreator` (or dataset function) for the workers; by default the prepared shards.
        strategy: optional ParameterServerStrategy; by default one built from `tf_config`.
        on_formed: called once the strategy is connected to the parameter servers and workers.

    Returns:
        The training history (also written to `history.json`).
    """
    import tensorflow as tf

    check_topology(tf_config, config)
    runtime = config.runtime
    prepared = setup.prepare(config, chief=True)
    check_graph_readable(shard_place(runtime.data_dir, prepared.meta), "parameter_server")
    with StatusPublisher(status_store(config)):
        if strategy is None:
            strategy = tf.distribute.experimental.ParameterServerStrategy(topology.cluster_resolver(tf_config))
        if on_formed:
            on_formed()
        workers = len(tf_config["cluster"]["worker"])
        servers = len(tf_config["cluster"]["ps"])
        batch_size = config.optim.batch_size
        steps = prepared.steps(config, batch_size)
        # Each step is one worker's batch, applied to the parameter servers on its own: the learning rate is not
        # scaled by the worker count (the mirrored runner scales it because its global batch grows with workers).
        learning_rate = config.optim.learning_rate
        built = setup.build(config, prepared, strategy, tf_config, learning_rate, steps, steps * batch_size, None)
        log.info(
            "chief: %d epochs x %d steps of %d examples over %d workers and %d parameter servers",
            config.optim.epochs,
            steps,
            batch_size,
            workers,
            servers,
        )
        if datasets is None:
            datasets = ps_dataset_creator(runtime.data_dir, prepared.meta, config.data, batch_size)
        try:
            built.model.fit(
                datasets,
                epochs=config.optim.epochs,
                initial_epoch=built.done,
                steps_per_epoch=steps,
                callbacks=built.callbacks(prepared.log_dir, chief=True),
                verbose=0,
            )
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as err:
            raise PeerUnavailableError(lost_peer_message(tf_config, err.message, "a parameter server")) from None
        history = of_run(
            config, prepared.meta, built.throughput.epochs, workers, batch_size, steps, learning_rate, servers
        )
        save_model(built.model, prepared.kind, runtime.model_dir, history)
        built.checkpoints.home.clear(remove_root=not runtime.checkpoint_dir)
    return history


def status_uri(config: TrainConfig) -> str:
    """The status document's location, always the run's own (`trainer.cluster.lifecycle.status_location`)."""
    from trainer.cluster.lifecycle import status_location

    rt = config.runtime
    return status_location(rt.status_uri, config.cluster.cluster_mode, rt.run_id, rt.model_dir)


def status_store(config: TrainConfig) -> StatusStore:
    """This run's status store: `status_uri` ({namespace} expanded), an s3:// one in the store `storage` names."""
    from trainer.k8s import objects
    from trainer.storage import kfpstore

    namespace = objects.namespace_if_pod()
    uri = kfpstore.expand(status_uri(config), namespace)
    store = kfpstore.store(config.storage, namespace) if uri.startswith("s3://") else None
    return open_status(uri, config.runtime.run_id, store)
