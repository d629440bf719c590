"""Multi-worker training: prepared shards + TF_CONFIG -> the chief's SavedModel, Keras file and history.

    TF_CONFIG='{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}' \\
        trainer-train --data /tmp/mnist --model-dir /tmp/model --epochs 5

With no TF_CONFIG the same code trains in one process. Under a TF_CONFIG with several workers it uses
MultiWorkerMirroredStrategy: the global batch is `--batch-size` x workers, each worker reads its own share of the
shards, and only the chief writes the model (the others save to a temporary directory and delete it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from trainer import cluster as cluster_lib
from trainer.atomic import atomic_directory, check_writable_parent, write_json
from trainer.cli import run_cli
from trainer.errors import PeerUnavailableError, UsageError
from trainer.records import decode_fn, load_metadata, shard_paths, verify_split

log = logging.getLogger(__name__)

SAVED_MODEL_DIR = "saved_model"
KERAS_FILE = "model.keras"
HISTORY_FILE = "history.json"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training worker needs; every field is checked on construction."""

    data_dir: str
    model_dir: str
    epochs: int = 5
    batch_size: int = 64
    learning_rate: float = 0.001
    steps_per_epoch: int | None = None
    checkpoint_dir: str | None = None
    seed: int = 42
    startup_timeout: float = 120.0
    collective_timeout: float = 60.0
    threads: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("data_dir", bool(self.data_dir), "a non-empty path"),
            ("model_dir", bool(self.model_dir), "a non-empty path"),
            ("epochs", self.epochs >= 1, "an integer of at least 1"),
            ("batch_size", self.batch_size >= 1, "an integer of at least 1"),
            ("learning_rate", self.learning_rate > 0, "a number above 0"),
            ("steps_per_epoch", self.steps_per_epoch is None or self.steps_per_epoch >= 1, "an integer of at least 1"),
            ("startup_timeout", self.startup_timeout > 0, "seconds above 0"),
            ("collective_timeout", self.collective_timeout > 0, "seconds above 0"),
            ("threads", self.threads >= 0, "0 (TensorFlow decides) or a positive count"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise UsageError(f"{name} {getattr(self, name)!r} is not allowed; allowed: {allowed}")


def tf_config_from_env() -> dict[str, Any] | None:
    text = os.environ.get("TF_CONFIG", "").strip()
    return cluster_lib.parse_tf_config(text) if text else None


def make_strategy(tf_config: dict[str, Any] | None, config: TrainConfig) -> Any:
    """MultiWorkerMirroredStrategy for a cluster of several workers, else the default strategy.

    Start-up is bounded by an out-of-process watchdog: the strategy constructor waits for every peer while holding
    the GIL and ignoring SIGTERM, and the communication timeout does not cover that wait.
    """
    import tensorflow as tf

    if cluster_lib.num_workers(tf_config) <= 1:
        return tf.distribute.get_strategy()
    from trainer.watchdog import StartupWatchdog

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=config.collective_timeout)
    with StartupWatchdog(tf_config, config.startup_timeout):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    log.info("cluster formed: %d workers, this is %s %d", strategy.num_replicas_in_sync,
             tf_config["task"]["type"], tf_config["task"]["index"])
    return strategy


def make_train_dataset(data_dir: str, meta: dict[str, Any], global_batch: int, num_workers: int, seed: int) -> Any:
    """Shuffled, repeated, globally batched training data that each worker auto-shards by file (or by record)."""
    import tensorflow as tf

    files = shard_paths(data_dir, meta, "train")
    shape = tuple(meta["image_shape"])
    ds = tf.data.Dataset.from_tensor_slices(files)
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.map(decode_fn(shape), num_parallel_calls=tf.data.AUTOTUNE).cache()
    ds = ds.shuffle(min(meta["splits"]["train"]["num_examples"], 10_000), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().map(lambda x, y: (tf.cast(x, tf.float32), y), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    policy = tf.data.experimental.AutoShardPolicy
    by_file = len(files) >= num_workers and len(files) % num_workers == 0
    options.experimental_distribute.auto_shard_policy = policy.FILE if by_file else policy.DATA
    return ds.with_options(options)


class ThroughputHistory:
    """Per-epoch loss, accuracy, wall time and examples/s, as a Keras callback."""

    def __init__(self, examples_per_epoch: int) -> None:
        import tf_keras as keras

        outer = self

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                outer._start = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                seconds = time.perf_counter() - outer._start
                entry = {"epoch": epoch + 1, "seconds": round(seconds, 3),
                         "examples_per_second": round(examples_per_epoch / seconds, 1)}
                entry.update({k: float(v) for k, v in (logs or {}).items()})
                outer.epochs.append(entry)
                log.info("epoch %d: %s", epoch + 1, json.dumps(entry))

        self.epochs: list[dict[str, float]] = []
        self._start = 0.0
        self.callback = _Callback()


def _save(model: Any, image_shape: tuple[int, int, int], directory: str, history: dict[str, Any]) -> None:
    import tensorflow as tf

    from trainer.model import serving_function

    tf.saved_model.save(model, f"{directory}/{SAVED_MODEL_DIR}", signatures={"serving_default": serving_function(model, image_shape)})
    model.save(f"{directory}/{KERAS_FILE}")
    write_json(f"{directory}/{HISTORY_FILE}", history)


def run(config: TrainConfig, datasets: Any = None, strategy: Any = None) -> dict[str, Any]:
    """Trains on `config.data_dir` and, on the chief, writes the model to `config.model_dir`.

    Args:
        config: the checked training configuration.
        datasets: optional training `tf.data.Dataset` yielding `(float image, label)` global batches (tests).
        strategy: optional `tf.distribute.Strategy`; by default built from the TF_CONFIG environment variable.

    Returns:
        The training history (also written to `history.json` by the chief).
    """
    import tensorflow as tf
    import tf_keras as keras

    tf_config = tf_config_from_env()
    chief = cluster_lib.is_chief(tf_config)
    meta = load_metadata(config.data_dir)
    verify_split(config.data_dir, meta, "train")
    if chief:
        check_writable_parent(config.model_dir)
    if config.threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(config.threads, 2))
    keras.utils.set_random_seed(config.seed)

    strategy = strategy or make_strategy(tf_config, config)
    workers = cluster_lib.num_workers(tf_config)
    global_batch = config.batch_size * workers
    train_examples = meta["splits"]["train"]["num_examples"]
    steps = config.steps_per_epoch or max(1, train_examples // global_batch)
    image_shape = tuple(meta["image_shape"])
    train_ds = datasets if datasets is not None else make_train_dataset(config.data_dir, meta, global_batch, workers, config.seed)

    with strategy.scope():
        from trainer.model import build_model

        model = build_model(image_shape, meta["num_classes"], config.learning_rate * workers ** 0.5)

    throughput = ThroughputHistory(steps * global_batch)
    backup_dir = config.checkpoint_dir or f"{config.model_dir.rstrip('/')}.backup"
    callbacks = [throughput.callback, keras.callbacks.BackupAndRestore(backup_dir=backup_dir)]
    log.info("training %d epochs x %d steps, global batch %d (%d per worker x %d workers)",
             config.epochs, steps, global_batch, config.batch_size, workers)
    try:
        model.fit(train_ds, epochs=config.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError) as err:
        raise PeerUnavailableError(f"lost contact with a peer during training: {err.message.splitlines()[0]}") from None

    history = {
        "epochs": throughput.epochs,
        "workers": workers,
        "global_batch_size": global_batch,
        "steps_per_epoch": steps,
        "learning_rate": config.learning_rate * workers ** 0.5,
        "dataset": meta.get("source"),
        "class_names": meta["class_names"],
        "image_shape": list(image_shape),
    }
    if not config.checkpoint_dir and os.path.isdir(backup_dir) and not os.listdir(backup_dir):
        os.rmdir(backup_dir)
    if chief:
        with atomic_directory(config.model_dir) as tmp:
            _save(model, image_shape, tmp, history)
        log.info("chief wrote the model to %s", config.model_dir)
    else:
        scratch = tempfile.mkdtemp(prefix="trainer-worker-")
        try:
            _save(model, image_shape, scratch, history)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return history


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainer-train", description="Train the CNN on prepared shards, alone or as one worker of a TF_CONFIG cluster.")
    p.add_argument("--data", required=True, help="prepared dataset directory (from trainer-prepare)")
    p.add_argument("--model-dir", required=True, help="where the chief writes saved_model/, model.keras and history.json")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch; the global batch is this x workers")
    p.add_argument("--learning-rate", type=float, default=0.001, help="for one worker; scaled by sqrt(workers)")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: train examples // global batch")
    p.add_argument("--checkpoint-dir", default=None, help="BackupAndRestore directory shared by all workers (default: MODEL_DIR.backup)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for every peer to join (default 120)")
    p.add_argument("--collective-timeout", type=float, default=60.0, help="seconds before a collective op with a silent peer fails (default 60)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TensorFlow decides)")
    p.add_argument("--tf-config", default=None, help="TF_CONFIG JSON (default: the TF_CONFIG environment variable)")
    p.add_argument("--cluster-spec", default=None, help='instead of --tf-config: cluster JSON such as {"worker": ["h0:2222", "h1:2222"]}')
    p.add_argument("--worker-index", type=int, default=None, help="with --cluster-spec: this worker's index")
    return p


def tf_config_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The TF_CONFIG these arguments (or, failing them, the environment) describe, checked; None for one process."""
    if args.cluster_spec is not None:
        if args.worker_index is None:
            raise UsageError("--cluster-spec needs --worker-index")
        try:
            spec = json.loads(args.cluster_spec)
        except json.JSONDecodeError as err:
            raise UsageError(f"cluster spec is not valid JSON ({err.msg}): {args.cluster_spec[:80]!r}") from None
        return cluster_lib.build_tf_config(spec, "worker", args.worker_index)
    text = args.tf_config if args.tf_config is not None else os.environ.get("TF_CONFIG", "")
    return cluster_lib.parse_tf_config(text) if text.strip() else None


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        data_dir=args.data, model_dir=args.model_dir, epochs=args.epochs, batch_size=args.batch_size,
        learning_rate=args.learning_rate, steps_per_epoch=args.steps_per_epoch, checkpoint_dir=args.checkpoint_dir,
        seed=args.seed, startup_timeout=args.startup_timeout, collective_timeout=args.collective_timeout, threads=args.threads,
    )


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        args = build_parser().parse_args(argv)
        config = config_from_args(args)
        tf_config = tf_config_from_args(args)
        if tf_config:
            os.environ["TF_CONFIG"] = json.dumps(tf_config)
        else:
            os.environ.pop("TF_CONFIG", None)
        run(config)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
