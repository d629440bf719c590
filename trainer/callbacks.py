"""Keras callbacks of the training loop: where a restarted run resumes, and what each epoch took."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

log = logging.getLogger(__name__)


class ResumeEpoch:
    """A Keras callback, placed after BackupAndRestore, that tells the input pipeline where training resumes.

    `variable` is the epoch the input pipeline starts at: 0 on a fresh run, the next unfinished epoch after
    BackupAndRestore restored a checkpoint.
    """

    def __init__(self, steps: int) -> None:
        import tensorflow as tf
        import tf_keras as keras

        self.variable = tf.Variable(0, dtype=tf.int64, trainable=False, name="resume_epoch")
        variable = self.variable

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                epoch, _ = self.model._maybe_load_initial_counters_from_ckpt(steps, 0)
                variable.assign(int(epoch))
                if epoch:
                    log.info(
                        "resuming from the checkpoint: epochs 1-%d are done, continuing with epoch %d", epoch, epoch + 1
                    )

        self.callback = _Callback()


class ThroughputHistory:
    """Per-epoch loss, accuracy, wall time and examples/s, as a Keras callback; `epochs` holds one dict per epoch.

    `mark` is a second callback to place before the checkpoint callback: the time between it and `callback` at the
    end of an epoch is recorded as `checkpoint_seconds` (what saving the epoch's checkpoint cost).
    """

    def __init__(self, examples_per_epoch: int) -> None:
        import tf_keras as keras

        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                outer._fit_start = time.perf_counter()

            def on_epoch_begin(self, epoch, logs=None):
                outer._start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                now = time.perf_counter()
                seconds = now - outer._start
                entry = {
                    "epoch": epoch + 1,
                    "seconds": round(seconds, 3),
                    "elapsed": round(now - outer._fit_start, 3),
                    "examples_per_second": round(examples_per_epoch / seconds, 1),
                }
                if outer._marked:
                    entry["checkpoint_seconds"] = round(now - outer._marked, 3)
                entry.update({k: float(v) for k, v in (logs or {}).items()})
                outer.epochs.append(entry)
                log.info("epoch %d: %s", epoch + 1, json.dumps(entry))

        class _Mark(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                outer._marked = time.perf_counter()

        self.epochs: list[dict[str, Any]] = []
        self._start = 0.0
        self._fit_start = 0.0
        self._marked = 0.0
        self.callback = _Callback()
        self.mark = _Mark()


def current_learning_rate(optimizer: Any) -> float:
    """The learning rate of the optimizer's next step, read the way tf_keras' own TensorBoard callback reads it."""
    import tf_keras as keras

    rate = getattr(optimizer, "_learning_rate", None)
    if rate is None:
        rate = optimizer.learning_rate
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(optimizer.iterations)
    return float(rate)


def run_log_dir(tensorboard_dir: str, run_id: str) -> str:
    """Where one run's event files go: `tensorboard_dir/<run_id>` (or `tensorboard_dir` itself without a run id).

    Each run is one TensorBoard "run" with a `train` and, when validating, a `validation` subdirectory, so
    TensorBoard draws both on one chart and every retrain appears beside the earlier ones.
    """
    root = tensorboard_dir.rstrip("/")
    return f"{root}/{run_id}" if run_id else root


class TensorBoardScalars:
    """Per-epoch scalars as TensorBoard event files (`tf.summary`), as a Keras callback; only the chief uses it.

    Under `log_dir/train`: loss, accuracy, learning_rate and examples_per_second; under `log_dir/validation`:
    loss and accuracy when the run validates. The step of every point is the epoch (1, 2, ...), as in
    history.json; the writers flush after every epoch, so TensorBoard shows a run while it trains.

    Args:
        log_dir: the run's directory (`run_log_dir`); any `tf.io.gfile` location.
        throughput: the run's ThroughputHistory, placed before this callback, for examples/s.
    """

    def __init__(self, log_dir: str, throughput: ThroughputHistory) -> None:
        import tensorflow as tf
        import tf_keras as keras

        self.log_dir = log_dir
        writers: dict[str, Any] = {}

        def writer(name: str) -> Any:
            if name not in writers:
                writers[name] = tf.summary.create_file_writer(f"{log_dir}/{name}")
            return writers[name]

        class _Callback(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                logs = dict(logs or {})
                step = epoch + 1
                train = {name: logs[name] for name in ("loss", "accuracy") if name in logs}
                train["learning_rate"] = current_learning_rate(self.model.optimizer)
                if throughput.epochs and throughput.epochs[-1]["epoch"] == step:
                    train["examples_per_second"] = throughput.epochs[-1]["examples_per_second"]
                validation = {name[4:]: logs[name] for name in ("val_loss", "val_accuracy") if name in logs}
                for name, values in (("train", train), ("validation", validation)):
                    if values:
                        with writer(name).as_default():
                            for tag, value in values.items():
                                tf.summary.scalar(tag, float(value), step=step)
                        writer(name).flush()

            def on_train_end(self, logs=None):
                for w in writers.values():
                    w.close()

        self.callback = _Callback()
