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
STRATEGIES = ("multi_worker_mirrored", "parameter_server")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training worker needs; every field is checked on construction."""

    data_dir: str
    model_dir: str
    epochs: int = 5
    batch_size: int = 64
    learning_rate: float = 0.002
    steps_per_epoch: int | None = None
    shuffle_buffer: int = 10_000
    steps_per_execution: int = 32
    checkpoint_dir: str | None = None
    seed: int = 42
    startup_timeout: float = 120.0
    collective_timeout: float = 0.0
    threads: int = 0
    pack_bytes: int = 0
    validate: bool = False
    strategy: str = "multi_worker_mirrored"
    status_uri: str | None = None
    chief_timeout: float = 60.0

    def __post_init__(self) -> None:
        checks = [
            ("data_dir", bool(self.data_dir), "a non-empty path"),
            ("model_dir", bool(self.model_dir), "a non-empty path"),
            ("epochs", self.epochs >= 1, "an integer of at least 1"),
            ("batch_size", self.batch_size >= 1, "an integer of at least 1"),
            ("learning_rate", self.learning_rate > 0, "a number above 0"),
            ("steps_per_epoch", self.steps_per_epoch is None or self.steps_per_epoch >= 1, "an integer of at least 1"),
            ("shuffle_buffer", self.shuffle_buffer >= 1, "an integer of at least 1"),
            ("steps_per_execution", self.steps_per_execution >= 1, "an integer of at least 1"),
            ("startup_timeout", self.startup_timeout > 0, "seconds above 0"),
            ("collective_timeout", self.collective_timeout >= 0, "seconds (0: no timeout)"),
            ("threads", self.threads >= 0, "0 (TensorFlow decides) or a positive count"),
            ("pack_bytes", self.pack_bytes >= 0, "0 (TensorFlow decides) or a positive byte count"),
            ("strategy", self.strategy in STRATEGIES, " or ".join(STRATEGIES)),
            ("chief_timeout", self.chief_timeout > 0, "seconds above 0"),
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

    # A collective timeout makes TF 2.21 start a thread per collective op that never exits ("collective_ops"
    # threads, about 400/s on MNIST); a long run dies at the thread limit. Peers that vanish are detected anyway
    # by the coordination service's heartbeats, so the timeout is off unless asked for.
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=config.pack_bytes, timeout_seconds=config.collective_timeout or None)
    with StartupWatchdog(tf_config, config.startup_timeout):
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    log.info("cluster formed: %d workers, this is %s %d (pid %d)", strategy.num_replicas_in_sync,
             tf_config["task"]["type"], tf_config["task"]["index"], os.getpid())
    return strategy


def lost_peer_message(tf_config: dict[str, Any] | None, detail: str) -> str:
    """One line naming the peers that no longer answer (probed now), with the first line of TensorFlow's error."""
    from trainer.watchdog import describe_peers, unreachable

    gone = unreachable(describe_peers(tf_config)) if tf_config else []
    who = "; ".join(gone) if gone else "no peer is unreachable now"
    return f"lost contact with a peer during training ({who}): {detail.strip().splitlines()[0][:300]}"


def make_train_dataset(data_dir: str, meta: dict[str, Any], config: TrainConfig, steps: int, workers: int, rank: int,
                       start_epoch: Any) -> Any:
    """This worker's share of the training data, reshuffled per epoch and globally batched.

    Sharding is explicit (whole files when they divide evenly among the workers, else every N-th record), and
    epoch `e` is a fixed function of (seed, e): exactly `steps x batch_size` records shuffled with seed + e. The
    stream starts at `start_epoch`, a variable set once BackupAndRestore has restored, so a restarted worker
    sees the same data the uninterrupted run would have.
    """
    import tensorflow as tf

    files = shard_paths(data_dir, meta, "train")
    by_file = workers > 1 and len(files) % workers == 0
    names = tf.data.Dataset.from_tensor_slices(files)
    if by_file:
        names = names.shard(workers, rank)
    records = names.interleave(tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
    records = records.map(decode_fn(tuple(meta["image_shape"])), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if workers > 1 and not by_file:
        records = records.shard(workers, rank)
    records = records.cache()
    # tf.data keeps a cache only once an iterator has read it to the end, and an epoch shorter than this worker's
    # share (--steps-per-epoch) stops mid-way: the cache would be thrown away and every epoch would read and decode
    # the files again. This pass yields nothing and reads the cache to the end, so it is filled once (in batches:
    # over a filled cache that takes 0.1 s for 60,000 images, against 1.3 s one element at a time).
    fill = records.batch(4096).filter(lambda images, labels: False).unbatch()
    per_epoch = steps * config.batch_size
    buffer = min(meta["splits"]["train"]["num_examples"], config.shuffle_buffer)

    def epoch_block(epoch):
        return records.shuffle(buffer, seed=config.seed * 1000 + epoch, reshuffle_each_iteration=False).repeat().take(per_epoch)

    # Endless, and declared so: with a finite or unknown cardinality MultiWorkerMirroredStrategy all-reduces a
    # "has data" flag across the workers before every step. `fit` ends each epoch after `steps` steps.
    epochs = tf.data.Dataset.counter().filter(lambda e: e >= start_epoch).flat_map(epoch_block)
    ds = fill.concatenate(epochs).apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    ds = ds.batch(config.batch_size * workers, drop_remainder=True)
    ds = ds.map(lambda x, y: (tf.cast(x, tf.float32), y), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    options.deterministic = True
    return ds.with_options(options)


def make_eval_dataset(data_dir: str, meta: dict[str, Any], global_batch: int, workers: int, rank: int) -> Any:
    """This worker's share of the test split, repeated so every worker runs the same number of validation steps."""
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(shard_paths(data_dir, meta, "test")).map(decode_fn(tuple(meta["image_shape"])))
    if workers > 1:
        ds = ds.shard(workers, rank)
    ds = ds.cache().repeat().map(lambda x, y: (tf.cast(x, tf.float32), y)).batch(global_batch, drop_remainder=True)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


class ResumeEpoch:
    """A Keras callback, placed after BackupAndRestore, that tells the input pipeline where training resumes."""

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
                    log.info("resuming from the checkpoint: epochs 1-%d are done, continuing with epoch %d", epoch, epoch + 1)

        self.callback = _Callback()


class ThroughputHistory:
    """Per-epoch loss, accuracy, wall time and examples/s, as a Keras callback."""

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
                entry = {"epoch": epoch + 1, "seconds": round(seconds, 3), "elapsed": round(now - outer._fit_start, 3),
                         "examples_per_second": round(examples_per_epoch / seconds, 1)}
                entry.update({k: float(v) for k, v in (logs or {}).items()})
                outer.epochs.append(entry)
                log.info("epoch %d: %s", epoch + 1, json.dumps(entry))

        self.epochs: list[dict[str, float]] = []
        self._start = 0.0
        self._fit_start = 0.0
        self.callback = _Callback()


def _save(model: Any, image_shape: tuple[int, int, int], directory: str, history: dict[str, Any]) -> None:
    import tensorflow as tf

    from trainer.model import serving_function

    tf.saved_model.save(model, f"{directory}/{SAVED_MODEL_DIR}", signatures={"serving_default": serving_function(model, image_shape)})
    model.save(f"{directory}/{KERAS_FILE}")
    write_json(f"{directory}/{HISTORY_FILE}", history)


def save_model(model: Any, image_shape: tuple[int, int, int], model_dir: str, history: dict[str, Any]) -> None:
    """The chief's export: saved_model/, model.keras and history.json, all or nothing."""
    with atomic_directory(model_dir) as tmp:
        _save(model, image_shape, tmp, history)
    log.info("chief wrote the model to %s", model_dir)


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
    if config.strategy == "multi_worker_mirrored" and tf_config and tf_config["cluster"].get("ps"):
        raise UsageError("TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored; "
                         "allowed: no ps tasks, or --strategy parameter_server")
    meta = load_metadata(config.data_dir)
    verify_split(config.data_dir, meta, "train")
    if chief:
        check_writable_parent(config.model_dir)
    if config.threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(config.threads, 2))
    keras.utils.set_random_seed(config.seed)
    if config.strategy == "parameter_server":
        from trainer import ps

        ps.check_topology(tf_config)
        return ps.run_chief(config, tf_config, meta, ps.status_uri(config))

    strategy = strategy or make_strategy(tf_config, config)
    workers = cluster_lib.num_workers(tf_config)
    global_batch = config.batch_size * workers
    train_examples = meta["splits"]["train"]["num_examples"]
    steps = config.steps_per_epoch or max(1, train_examples // global_batch)
    image_shape = tuple(meta["image_shape"])
    rank = cluster_lib.worker_rank(tf_config)
    resume = ResumeEpoch(steps)
    if datasets is not None:
        train_ds = datasets
    else:
        train_ds = make_train_dataset(config.data_dir, meta, config, steps, workers, rank, resume.variable)

    with strategy.scope():
        from trainer.model import build_model

        model = build_model(image_shape, meta["num_classes"], config.learning_rate * workers ** 0.5, decay_steps=config.epochs * steps,
                            steps_per_execution=config.steps_per_execution)

    throughput = ThroughputHistory(steps * global_batch)
    backup_dir = config.checkpoint_dir or f"{config.model_dir.rstrip('/')}.backup"
    callbacks = [keras.callbacks.BackupAndRestore(backup_dir=backup_dir), resume.callback, throughput.callback]
    log.info("training %d epochs x %d steps, global batch %d (%d per worker x %d workers)",
             config.epochs, steps, global_batch, config.batch_size, workers)
    validation: dict[str, Any] = {}
    if config.validate:
        verify_split(config.data_dir, meta, "test")
        validation = {"validation_data": make_eval_dataset(config.data_dir, meta, global_batch, workers, rank),
                      "validation_steps": max(1, meta["splits"]["test"]["num_examples"] // global_batch)}
    try:
        model.fit(train_ds, epochs=config.epochs, steps_per_epoch=steps, callbacks=callbacks, verbose=0, **validation)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.CancelledError, tf.errors.AbortedError) as err:
        raise PeerUnavailableError(lost_peer_message(tf_config, err.message)) from None

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
    if not config.checkpoint_dir:
        try:
            os.rmdir(backup_dir)  # empty after a successful run; workers sharing it race to remove it
        except OSError:
            pass
    if chief:
        save_model(model, image_shape, config.model_dir, history)
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
    p.add_argument("--learning-rate", type=float, default=0.002,
                   help="peak Adam learning rate for one worker, scaled by sqrt(workers), cosine-decayed to 5%% over the run")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="default: train examples // global batch")
    p.add_argument("--shuffle-buffer", type=int, default=TrainConfig.shuffle_buffer, help="examples in the shuffle buffer (default %(default)s)")
    p.add_argument("--steps-per-execution", type=int, default=TrainConfig.steps_per_execution,
                   help="training steps per call of the compiled step function (default %(default)s; fewer Python round trips "
                        "and per-call synchronisations between workers, docs/benchmarks.md)")
    p.add_argument("--checkpoint-dir", default=None, help="BackupAndRestore directory shared by all workers (default: MODEL_DIR.backup)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--startup-timeout", type=float, default=120.0, help="seconds to wait for every peer to join (default 120)")
    p.add_argument("--collective-timeout", type=float, default=0.0,
                   help="seconds before one collective op fails (default 0: none; a lost peer is still detected by the "
                        "coordination service's heartbeats in about 10 s). TF 2.21 leaks one thread per collective op "
                        "when this is set, so long runs crash: use it only for short ones")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TensorFlow decides)")
    p.add_argument("--pack-bytes", type=int, default=0, help="all-reduce gradient packing: bytes per pack (0: TensorFlow decides)")
    p.add_argument("--validate", action="store_true", help="evaluate on the test split after every epoch (val_loss, val_accuracy in the history)")
    p.add_argument("--strategy", default="multi_worker_mirrored", choices=STRATEGIES,
                   help="multi_worker_mirrored (synchronous all-reduce, default) or parameter_server (chief + ps + workers)")
    p.add_argument("--status-uri", default=None,
                   help="parameter_server: the chief's status document that ps and workers poll (default: MODEL_DIR.status.json)")
    p.add_argument("--chief-timeout", type=float, default=60.0,
                   help="parameter_server: a ps or worker exits when the chief's heartbeat is older than this (default 60)")
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
        learning_rate=args.learning_rate, steps_per_epoch=args.steps_per_epoch,
        shuffle_buffer=args.shuffle_buffer, steps_per_execution=args.steps_per_execution, checkpoint_dir=args.checkpoint_dir,
        seed=args.seed, startup_timeout=args.startup_timeout, collective_timeout=args.collective_timeout, threads=args.threads,
        pack_bytes=args.pack_bytes, validate=args.validate, strategy=args.strategy, status_uri=args.status_uri,
        chief_timeout=args.chief_timeout,
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
        if config.strategy == "parameter_server" and tf_config and tf_config["task"]["type"] in ("ps", "worker"):
            from trainer import ps

            ps.check_topology(tf_config)
            server_code.append(ps.run_server(tf_config, ps.status_uri(config), config.startup_timeout, config.chief_timeout))
            return
        run(config)

    server_code: list[int] = []
    code = run_cli(body)
    return code or (server_code[0] if server_code else 0)


if __name__ == "__main__":
    sys.exit(main())
