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
    """Per-epoch loss, accuracy, wall time and examples/s, as a Keras callback; `epochs` holds one dict per epoch."""

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
                entry.update({k: float(v) for k, v in (logs or {}).items()})
                outer.epochs.append(entry)
                log.info("epoch %d: %s", epoch + 1, json.dumps(entry))

        self.epochs: list[dict[str, Any]] = []
        self._start = 0.0
        self._fit_start = 0.0
        self.callback = _Callback()
