"""What both runners do around `fit`: check inputs and outputs, size threads, seed, build the model and its callbacks.

The mirrored runner (`trainer.training.mirrored`) and the parameter-server chief (`trainer.training.parameter_server`)
differ in the cluster they form, the data they feed and how the learning rate scales; everything else is here, so the
two honour the same settings the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from trainer.cluster.resume import home_for
from trainer.config.contract import TrainConfig
from trainer.config.gate import Gate
from trainer.core.cpus import ranges, thread_counts
from trainer.core.files import check_writable_parent
from trainer.core.runs import run_log_dir
from trainer.data.readers import Reader
from trainer.modeling import kinds
from trainer.modeling.kind import Compiled, ModelKind
from trainer.records.dataset import DatasetMetadata
from trainer.training.callbacks import EpochCheckpoints, TensorBoardScalars, ThroughputHistory

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """What a runner knows before it builds anything: the dataset, the model's kind, TensorBoard's place, threads.

    The dataset is its metadata and its reader (`kind.reader`). A kind that runs your code (a `model_fn`) has
    imported it before the cluster forms, so that a wrong name fails fast (its module must not run TensorFlow ops
    when imported: collective ops are configured when the strategy is created, before anything else touches
    TensorFlow's context).
    """

    meta: DatasetMetadata
    log_dir: str
    threads: int
    kind: ModelKind
    reader: Reader

    def steps(self, config: TrainConfig, global_batch: int) -> int:
        """Steps per epoch: the configured number, else one pass over the training split."""
        return config.optim.steps_per_epoch or max(1, self.meta.num_examples("train") // global_batch)


def prepare(config: TrainConfig, chief: bool, workers: int = 1, rank: int = 0) -> Prepared:
    """Checks the inputs and outputs, then sizes TensorFlow's thread pools and seeds weights, shuffles and dropout.

    The model's kind is chosen here, once (`trainer.modeling.kinds.choose`), and refuses what it cannot honour. The
    dataset is checked: the files of this worker's share (`rank` of `workers`) of the training split, the test split
    too when validating; on the chief, that the outputs are writable.

    Raises:
        UsageError: a missing or corrupt dataset, an output location that cannot be written, a model_fn that cannot
            be imported or that is not for this strategy, or data that only a model_fn can train on.
    """
    import tensorflow as tf
    import tf_keras as keras

    runtime = config.runtime
    meta = DatasetMetadata.read(runtime.data_dir)
    kind = kinds.choose(config.model)
    kind.check_settings(strategy=config.cluster.strategy)
    kind.check_data(runtime.data_dir, meta)
    reader = kind.reader(runtime.data_dir, meta)
    reader.verify("train", workers, rank)
    if config.optim.validate:
        reader.verify("test")
    log_dir = run_log_dir(runtime.tensorboard_dir, runtime.run_id) if runtime.tensorboard_dir else ""
    if chief:
        check_writable_parent(runtime.model_dir)
        if log_dir:
            check_writable_parent(f"{log_dir}/train")
    threads = thread_counts(runtime.threads)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra)
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter)
    except RuntimeError:
        threads = dataclasses.replace(threads, reason="TensorFlow was initialised before this run: kept its pools")
    log.info(
        "threads: %d intra-op, %d inter-op (%s) on CPUs %s",
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
        threads.reason,
        ranges(os.sched_getaffinity(0)),
    )
    keras.utils.set_random_seed(config.data.seed)
    kind.load()
    return Prepared(meta, log_dir, threads.intra, kind, reader)


@dataclasses.dataclass
class Built:
    """The compiled model, what records its epochs, its checkpoints, and the epochs already done."""

    model: Any
    throughput: ThroughputHistory
    checkpoints: EpochCheckpoints
    done: int

    def callbacks(self, log_dir: str, chief: bool) -> list[Any]:
        """Throughput, then the epoch checkpoint (its log line marks a finished epoch), then TensorBoard (chief)."""
        found = [self.throughput.callback, self.checkpoints.callback]
        if chief and log_dir:
            found.append(TensorBoardScalars(log_dir, self.throughput).callback)
        return found


def build(
    config: TrainConfig,
    prepared: Prepared,
    strategy: Any,
    tf_config: dict[str, Any] | None,
    learning_rate: float,
    steps: int,
    examples_per_epoch: int,
    resume_epoch: int | None,
    gate: Gate | None = None,
) -> Built:
    """Builds and compiles the model in the strategy's scope and restores the checkpoint to resume after.

    The model's kind builds it (`ModelKind.build`): the built-in CNN's learning rate follows a cosine over the run
    and `steps_per_execution` steps run per call; a model_fn's model comes compiled as its function compiled it.

    Args:
        config: the training configuration.
        prepared: what `prepare` found (the dataset's metadata and reader, the model's kind).
        strategy: the distribution strategy whose scope holds the variables.
        tf_config: this task's TF_CONFIG (None: one process), which names its checkpoint home.
        learning_rate: the peak learning rate of a model the trainer compiles.
        steps: steps per epoch.
        examples_per_epoch: for the throughput records.
        resume_epoch: the epoch to resume after (`trainer.training.callbacks.EpochCheckpoints.restore`).
        gate: the gate the run's evaluation will apply, if known: its metric must be one the model reports, which is
            checked here, before the first epoch, rather than by the evaluation after all the training.

    Raises:
        UsageError: the model does not report the gate's metric (naming the metrics it does report), or model_fn
            failed or returned something else than a compiled tf-keras model.
    """
    if gate is None and config.publish.gate:
        gate = Gate.of(config.publish.gate, config.publish.min_accuracy)
    compiled = Compiled(learning_rate, config.optim.epochs * steps, config.optim.steps_per_execution)
    with strategy.scope():
        model = prepared.kind.build(prepared.reader, compiled, gate)
        throughput = ThroughputHistory(examples_per_epoch)
        checkpoints = EpochCheckpoints(model, home_for(config, tf_config), throughput)
        done = checkpoints.restore(resume_epoch)
    return Built(model, throughput, checkpoints, done)
