"""The MultiWorkerMirroredStrategy runner: one worker of N identical workers (or one process alone).

    run(config, tf_config)        # tf_config None: one process with the default strategy

The cluster comes from the `tf_config` argument, not from the environment, so the runner can be called in-process
with any strategy and any training data (`datasets=`, `strategy=`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from trainer.cluster import topology
from trainer.cluster.peers import lost_peer_message
from trainer.config.contract import TrainConfig
from trainer.core.cpus import input_threads
from trainer.core.errors import PeerUnavailableError, UsageError
from trainer.data.inputs import eval_dataset, train_dataset
from trainer.modeling.export import save_and_discard, save_model
from trainer.records.history import History, of_run
from trainer.training import setup
from trainer.training.callbacks import first_step_log
from trainer.training.collectives import (
    Devices,
    choose_devices,
    communication_options,
    local_step_metrics,
    precision_policy,
)
from trainer.training.teardown import Teardown

log = logging.getLogger(__name__)

_LOST_PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "CancelledError", "AbortedError")


def local_devices(config: TrainConfig) -> tuple[Devices, str]:
    """This worker's devices and all-reduce (`choose_devices`) and the precision policy it trains under, logged.

    Raises:
        UsageError: mixed precision asked for on a worker without GPUs.
    """
    import tensorflow as tf

    devices = choose_devices(tf.config.list_physical_devices("GPU"))
    policy = precision_policy(config.model.mixed_precision, devices)
    log.info("devices: %s; precision %s", devices.describe(), policy)
    return devices, policy


def make_strategy(tf_config: dict[str, Any] | None, config: TrainConfig, devices: Devices) -> Any:
    """MultiWorkerMirroredStrategy for a cluster of several workers, else the default strategy.

    Each worker mirrors over all its GPUs (MultiWorkerMirroredStrategy's local devices) and all-reduces with NCCL
    when it has GPUs, RING otherwise (`choose_devices`); one process alone with several GPUs mirrors over them
    (MirroredStrategy). The constructor waits for every peer while holding the GIL; the start-up timeout is
    enforced from outside the process (`trainer.cluster.supervisor`).
    """
    import tensorflow as tf

    if topology.num_workers(tf_config) <= 1:
        return tf.distribute.MirroredStrategy() if devices.replicas > 1 else tf.distribute.get_strategy()
    # A collective timeout makes TF 2.21 start a thread per collective op that never exits ("collective_ops"
    # threads, about 400/s on MNIST); a long run dies at the thread limit. Peers that vanish are detected anyway
    # by the coordination service's heartbeats, so the timeout is off unless asked for.
    options = communication_options(devices, config.cluster.pack_bytes, config.cluster.collective_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=topology.cluster_resolver(tf_config), communication_options=options
    )
    log.info(
        "cluster formed: %d workers x %d replicas = %d, this is %s %d (pid %d), %s",
        topology.num_workers(tf_config),
        devices.replicas,
        strategy.num_replicas_in_sync,
        tf_config["task"]["type"],
        tf_config["task"]["index"],
        os.getpid(),
        devices.describe(),
    )
    return strategy


def run(
    config: TrainConfig,
    tf_config: dict[str, Any] | None,
    *,
    datasets: Any = None,
    strategy: Any = None,
    on_formed: Callable[[], None] | None = None,
    resume_epoch: int | None = None,
    teardown: Teardown | None = None,
) -> History:
    """Trains on `config.runtime.data_dir` and, on the chief, writes the model to `config.runtime.model_dir`.

    Args:
        config: the checked training configuration.
        tf_config: this task's TF_CONFIG as a dict (`trainer.cluster.topology.build_tf_config`); None for one process.
        datasets: optional training `tf.data.Dataset` of `(features, label)` global batches, endless.
        strategy: optional `tf.distribute.Strategy`; by default one built from `tf_config`.
        on_formed: called once the strategy exists, i.e. the cluster has formed (the supervisor's watchdog).
        resume_epoch: the epoch the cluster's supervisors agreed to resume after (`trainer.cluster.resume`; 0: from the
            start); None: after this task's own latest checkpoint, if any.
        teardown: the training process's `Teardown`, which keeps a worker's training input until the process leaves
            (`trainer.training.teardown`); None: the input ends with `fit`.

    Returns:
        The training history (also written to `history.json` by the chief).
    """
    import tensorflow as tf
    import tf_keras as keras

    if tf_config and tf_config["cluster"].get("ps"):
        raise UsageError(
            "TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored; "
            "allowed: no ps tasks, or --strategy parameter_server"
        )
    devices, policy = local_devices(config)
    runtime = config.runtime
    chief = topology.is_chief(tf_config)
    workers, rank = topology.num_workers(tf_config), topology.worker_rank(tf_config)
    prepared = setup.prepare(config, chief, workers, rank)
    meta = prepared.meta
    strategy = strategy or make_strategy(tf_config, config, devices)
    if on_formed:
        on_formed()
    replicas = workers * devices.replicas
    batch_size = config.optim.batch_size * devices.replicas
    global_batch = config.optim.batch_size * replicas
    steps = prepared.steps(config, global_batch)
    learning_rate = scaled = config.optim.learning_rate * replicas**0.5
    threads = input_threads(prepared.threads, len(devices.gpus))
    # Before the model is built: its layers take the global policy when they are created.
    keras.mixed_precision.set_global_policy(policy)
    built = setup.build(config, prepared, strategy, tf_config, learning_rate, steps, steps * global_batch, resume_epoch)
    model, done = built.model, built.done
    learning_rate = prepared.kind.learning_rate(model, learning_rate)
    if workers > 1 and not config.cluster.sync_batch_metrics:
        local_step_metrics(model)
    if datasets is None:
        datasets = train_dataset(
            runtime.data_dir,
            meta,
            config.data,
            batch_size,
            steps,
            workers,
            rank,
            done,
            threads,
            reader=prepared.reader,
        )
    if teardown is not None and workers > 1:
        datasets = teardown.keep(strategy, datasets, rank, workers)
    callbacks = [*built.callbacks(prepared.log_dir, chief), first_step_log()]
    log.info(
        "training %d epochs x %d steps, global batch %d (%d per replica x %d replicas: %d workers x %d %s), "
        "learning rate %g per replica x sqrt(%d replicas) = %g (a model_fn's optimizer keeps its own), input "
        "pipeline %d threads",
        config.optim.epochs,
        steps,
        global_batch,
        config.optim.batch_size,
        replicas,
        workers,
        devices.replicas,
        "GPUs each" if devices.gpus else "replica each",
        config.optim.learning_rate,
        replicas,
        scaled,
        threads,
    )
    validation: dict[str, Any] = {}
    if config.optim.validate:
        validation = {
            "validation_data": eval_dataset(
                runtime.data_dir, meta, global_batch, workers, rank, threads, reader=prepared.reader
            ),
            "validation_steps": max(1, meta.num_examples("test") // global_batch),
        }
    try:
        model.fit(
            datasets,
            epochs=config.optim.epochs,
            initial_epoch=done,
            steps_per_epoch=steps,
            callbacks=callbacks,
            verbose=0,
            **validation,
        )
    except tf.errors.OpError as err:
        if type(err).__name__ not in _LOST_PEER_ERRORS or workers <= 1:
            raise
        raise PeerUnavailableError(lost_peer_message(tf_config, err.message)) from None

    recorded = prepared.kind.recorded_learning_rate(config.optim.learning_rate, learning_rate)
    history = of_run(config, meta, built.throughput.epochs, workers, global_batch, steps, learning_rate, 0, recorded)
    if chief:
        save_model(model, prepared.kind, runtime.model_dir, history)
    else:
        save_and_discard(model, prepared.kind, history)
    built.checkpoints.home.clear(remove_root=not runtime.checkpoint_dir)
    return history
