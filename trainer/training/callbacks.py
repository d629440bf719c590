"""Keras callbacks of the training loop: the checkpoint a restarted or replaced task resumes from; epoch timings."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from trainer.core.memory import size
from trainer.core.processes import process_seconds
from trainer.data.place import bytes_read
from trainer.modeling.kind import current_learning_rate

log = logging.getLogger(__name__)


class EpochCheckpoints:
    """A Keras callback that keeps this task's checkpoint of the latest finished epoch (`trainer.cluster.resume`).

    Every worker writes its own copy after every epoch (under MultiWorkerMirroredStrategy they all take part in a
    save anyway, and their variables are identical), so any survivor can hand it to a replaced peer. Place it after
    the ThroughputHistory callback: the manifest carries the per-epoch results, so a resumed run's history lists
    every epoch, and the epoch's log line is written once its checkpoint is saved.

    Args:
        model: the compiled model; its variables and its optimizer's (step counter included) are checkpointed.
        home: this task's `CheckpointHome`.
        throughput: the run's ThroughputHistory.
    """

    def __init__(self, model: Any, home: Any, throughput: ThroughputHistory) -> None:
        import tensorflow as tf
        import tf_keras as keras

        self.home = home
        throughput.log_epochs = False
        self.checkpoint = tf.train.Checkpoint(model=model)
        self._model = model
        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                started = time.perf_counter()
                outer.write(epoch + 1)
                entry = throughput.epochs[-1]
                entry["checkpoint_seconds"] = round(time.perf_counter() - started, 3)
                home.commit(epoch + 1, throughput.epochs)
                log_epoch(entry)

        self.throughput = throughput
        self.callback = _Callback()

    def write(self, epoch: int) -> None:
        """Writes the checkpoint after `epoch`; a failure leaves none of its files behind.

        Raises:
            NoSpaceError, DeniedError, QuotaError, StoreUnavailableError: the disk or store failed the write
                (`trainer.core.faults`: exit 3, 4, 5, 142); the manifest still names the previous checkpoint.
        """
        prefix = self.home.prefix(epoch)
        try:
            self.checkpoint.write(prefix)
        except Exception as err:
            from trainer.core.faults import classify

            _discard_checkpoint(prefix)
            fault = classify(err, f"write the checkpoint of epoch {epoch} to {prefix!r}", store_operation=True)
            if fault is None:
                raise
            raise fault from err

    def restore(self, epoch: int | None) -> int:
        """Restores the checkpoint after `epoch` before training; returns the number of finished epochs.

        Args:
            epoch: the epoch the cluster agreed to resume after (0: start afresh); None: this home's latest, as
                a process with no peers to agree with does.

        Raises:
            PeerUnavailableError: the agreed checkpoint is not in this home (it was lost after the agreement:
                retryable, the next attempt agrees again).
        """
        from trainer.core.errors import PeerUnavailableError

        latest = self.home.latest()
        if epoch is None:
            epoch = latest.epoch if latest else 0
        if not epoch:
            return 0
        if latest is None or latest.epoch != epoch:
            raise PeerUnavailableError(
                f"the checkpoint of epoch {epoch} the cluster agreed on is not in {self.home.uri} "
                f"(it holds {latest.epoch if latest else 'none'})"
            )
        self._model.optimizer.build(self._model.trainable_variables)
        self.checkpoint.read(self.home.prefix(epoch)).assert_existing_objects_matched()
        self.throughput.epochs[:] = [dict(e) for e in latest.epochs]
        done = "epoch 1 is done" if epoch == 1 else f"epochs 1-{epoch} are done"
        log.info("resuming from the checkpoint: %s, continuing with epoch %d", done, epoch + 1)
        return epoch


def _discard_checkpoint(prefix: str) -> None:
    """Removes what a failed write of the checkpoint at `prefix` left (its files, TensorFlow's `_temp` directory)."""
    import tensorflow as tf

    for pattern in (f"{prefix}.*", f"{prefix}_temp*"):
        try:
            found = tf.io.gfile.glob(pattern)
        except tf.errors.OpError as err:
            log.warning("could not list what the failed checkpoint write left at %s: %s", pattern, err)
            continue
        for path in found:
            try:
                if tf.io.gfile.isdir(path):
                    tf.io.gfile.rmtree(path)
                else:
                    tf.io.gfile.remove(path)
            except tf.errors.OpError as err:
                log.warning("could not remove %s, left by the failed checkpoint write: %s", path, err)


def log_epoch(entry: dict[str, Any]) -> None:
    """The line that says an epoch is finished (and, with checkpoints, saved): `epoch 3: {...}`."""
    log.info("epoch %d: %s", entry["epoch"], json.dumps(entry))


class ThroughputHistory:
    """Per-epoch loss, accuracy, wall time and examples/s, as a Keras callback; `epochs` holds one dict per epoch.

    `seconds` is the whole epoch, validation included (`validation_seconds` of it, when validating); `ended_at` is
    the Unix time the epoch ended.
    """

    def __init__(self, examples_per_epoch: int) -> None:
        import tf_keras as keras

        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                outer._fit_start = time.perf_counter()

            def on_epoch_begin(self, epoch, logs=None):
                outer._start = time.perf_counter()
                outer._validation_start = None

            def on_test_begin(self, logs=None):
                outer._validation_start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                now = time.perf_counter()
                seconds = now - outer._start
                entry = {
                    "epoch": epoch + 1,
                    "seconds": round(seconds, 3),
                    "elapsed": round(now - outer._fit_start, 3),
                    "examples_per_second": round(examples_per_epoch / seconds, 1),
                    "ended_at": round(time.time(), 3),
                }
                if outer._validation_start is not None:
                    entry["validation_seconds"] = round(now - outer._validation_start, 3)
                entry.update(scalar_logs(logs))
                outer.epochs.append(entry)
                if outer.log_epochs:
                    log_epoch(entry)
                total, distinct, files = bytes_read()
                if total:
                    log.info(
                        "dataset read through fsspec by this process so far: %s in all (%d bytes), %s of %d files "
                        "(%d bytes) counted once",
                        size(total),
                        total,
                        size(distinct),
                        files,
                        distinct,
                    )

        self.epochs: list[dict[str, Any]] = []
        self.log_epochs = True
        self._start = 0.0
        self._fit_start = 0.0
        self._validation_start: float | None = None
        self.callback = _Callback()


def first_step_log() -> Any:
    """A Keras callback that logs when the first training step (the first call of the step function) is done.

    The time counts from this process's start: importing TensorFlow, checking the dataset, building the model and the
    input pipeline, and the first step itself, which fills a cached share. A batch-level callback, so the
    multi_worker_mirrored runner's only (ParameterServerStrategy refuses them).
    """
    import tf_keras as keras

    class _Callback(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self._supports_tf_logs = True  # it reads no logs: Keras need not turn them into numbers every step
            self._began, self._done = 0.0, False

        def on_train_begin(self, logs=None):
            self._began, self._done = time.perf_counter(), False

        def on_train_batch_end(self, batch, logs=None):
            if not self._done:
                self._done = True
                log.info(
                    "first training step done %.1f s after this process started, %.1f s after training began",
                    process_seconds(),
                    time.perf_counter() - self._began,
                )

    return _Callback()


def scalar_logs(logs: dict[str, Any] | None) -> dict[str, float]:
    """Keras' epoch logs that are one number each (a per-class metric is not: history and TensorBoard take scalars)."""
    import numpy as np

    return {name: float(value) for name, value in (logs or {}).items() if np.ndim(value) == 0}


class TensorBoardScalars:
    """Per-epoch scalars as TensorBoard event files (`tf.summary`), as a Keras callback; only the chief uses it.

    Under `log_dir/train`: loss and every metric the model was compiled with (accuracy for the CNN),
    learning_rate and examples_per_second; under `log_dir/validation`: the same without the `val_` prefix when
    the run validates. The step of every point is the epoch (1, 2, ...), as in
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
                logs = scalar_logs(logs)
                step = epoch + 1
                train = {name: value for name, value in logs.items() if not name.startswith("val_")}
                train["learning_rate"] = current_learning_rate(self.model.optimizer)
                if throughput.epochs and throughput.epochs[-1]["epoch"] == step:
                    train["examples_per_second"] = throughput.epochs[-1]["examples_per_second"]
                validation = {name[4:]: value for name, value in logs.items() if name.startswith("val_")}
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
