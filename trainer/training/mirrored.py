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

from trainer.cluster import tf_config as cluster_lib
from trainer.cluster.peers import lost_peer_message
from trainer.config.contract import TrainConfig
from trainer.core.errors import PeerUnavailableError, UsageError
from trainer.data.inputs import eval_dataset, train_dataset
from trainer.modeling.export import save_and_discard, save_model
from trainer.training import setup
from trainer.training.callbacks import current_learning_rate
from trainer.training.collectives import local_step_metrics
from trainer.training.history import History, of_run

log = logging.getLogger(__name__)

_LOST_PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "CancelledError", "AbortedError")


def make_strategy(tf_config: dict[str, Any] | None, config: TrainConfig) -> Any:
    """MultiWorkerMirroredStrategy for a cluster of several workers, else the default strategy.

    The constructor waits for every peer while holding the GIL; the start-up timeout is enforced from outside the
    process (`trainer.cluster.supervisor`).
    """
    import tensorflow as tf

    if cluster_lib.num_workers(tf_config) <= 1:
        return tf.distribute.get_strategy()
    # A collective timeout makes TF 2.21 start a thread per collective op that never exits ("collective_ops"
    # threads, about 400/s on MNIST); a long run dies at the thread limit. Peers that vanish are detected anyway
    # by the coordination service's heartbeats, so the timeout is off unless asked for.
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=config.cluster.pack_bytes, timeout_seconds=config.cluster.collective_timeout or None
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_lib.cluster_resolver(tf_config), communication_options=options
    )
    log.info(
        "cluster formed: %d workers, this is %s %d (pid %d)",
        strategy.num_replicas_in_sync,
        tf_config["task"]["type"],
        tf_config["task"]["index"],
        os.getpid(),
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
) -> History:
    """Trains on `config.runtime.data_dir` and, on the chief, writes the model to `config.runtime.model_dir`.

    Args:
        config: the checked training configuration.
        tf_config: this task's TF_CONFIG as a dict (`trainer.cluster.tf_config.build_tf_config`); None for one process.
        datasets: optional training `tf.data.Dataset` of `(features, label)` global batches, endless.
        strategy: optional `tf.distribute.Strategy`; by default one built from `tf_config`.
        on_formed: called once the strategy exists, i.e. the cluster has formed (the supervisor's watchdog).
        resume_epoch: the epoch the cluster's supervisors agreed to resume after (`trainer.cluster.resume`; 0: from the
            start); None: after this task's own latest checkpoint, if any.

    Returns:
        The training history (also written to `history.json` by the chief).
    """
    import tensorflow as tf

    if tf_config and tf_config["cluster"].get("ps"):
        raise UsageError(
            "TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored; "
            "allowed: no ps tasks, or --strategy parameter_server"
        )
    runtime = config.runtime
    chief = cluster_lib.is_chief(tf_config)
    prepared = setup.prepare(config, chief)
    meta = prepared.meta
    strategy = strategy or make_strategy(tf_config, config)
    if on_formed:
        on_formed()
    workers = cluster_lib.num_workers(tf_config)
    batch_size = config.optim.batch_size
    global_batch = batch_size * workers
    steps = prepared.steps(config, global_batch)
    rank = cluster_lib.worker_rank(tf_config)
    learning_rate = config.optim.learning_rate * workers**0.5
    built = setup.build(config, prepared, strategy, tf_config, learning_rate, steps, steps * global_batch, resume_epoch)
    model, done = built.model, built.done
    if prepared.model_fn:
        learning_rate = current_learning_rate(model.optimizer)
    if workers > 1 and not config.cluster.sync_batch_metrics:
        local_step_metrics(model)
    if datasets is None:
        datasets = train_dataset(
            runtime.data_dir, meta, config.data, batch_size, steps, workers, rank, done, prepared.threads
        )
    callbacks = built.callbacks(prepared.log_dir, chief)
    log.info(
        "training %d epochs x %d steps, global batch %d (%d per worker x %d workers)",
        config.optim.epochs,
        steps,
        global_batch,
        batch_size,
        workers,
    )
    validation: dict[str, Any] = {}
    if config.optim.validate:
        validation = {
            "validation_data": eval_dataset(runtime.data_dir, meta, global_batch, workers, rank, prepared.threads),
            "validation_steps": max(1, meta["splits"]["test"]["num_examples"] // global_batch),
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

    history = of_run(config, meta, built.throughput.epochs, workers, global_batch, steps, learning_rate)
    if chief:
        save_model(model, prepared.image_shape, runtime.model_dir, history)
    else:
        save_and_discard(model, prepared.image_shape, history)
    built.checkpoints.home.clear(remove_root=not runtime.checkpoint_dir)
    return history
