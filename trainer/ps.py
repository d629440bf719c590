"""Parameter-server training: the chief coordinates, parameter servers hold the variables, workers run steps.

Parameter servers and workers only run a `tf.distribute.Server`; nothing in TensorFlow tells them the job is over.
So the chief publishes a small status document (`--status-uri`, any tf.io.gfile path: a local file for the
launcher, a bucket or shared volume on a cluster) and refreshes it every `STATUS_INTERVAL` seconds:

    {"state": "running" | "succeeded" | "failed", "heartbeat": <unix time>, "detail": "..."}

Servers poll it: `succeeded` -> exit 0; `failed` -> exit 1; no status after `--startup-timeout`, or a heartbeat
older than `--chief-timeout` (the chief vanished) -> exit 138 (retryable). A lost worker does not stop training:
the chief's ClusterCoordinator reschedules its steps on the others.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from trainer import cluster as cluster_lib
from trainer.atomic import exists, read_json, write_json
from trainer.errors import EXIT_FAILED, EXIT_PEER_UNAVAILABLE, PeerUnavailableError, UsageError

log = logging.getLogger(__name__)

STATUS_INTERVAL = 2.0
POLL_INTERVAL = 1.0


def check_topology(tf_config: dict[str, Any] | None) -> None:
    if not tf_config or not tf_config["cluster"].get("chief") or not tf_config["cluster"].get("ps") or not tf_config["cluster"].get("worker"):
        raise UsageError("parameter_server strategy needs a TF_CONFIG with one chief, at least one ps and at least one worker; "
                         f"got jobs {sorted(tf_config['cluster']) if tf_config else 'none (no TF_CONFIG)'}")


class StatusPublisher:
    """The chief's side: writes the status document now and keeps its heartbeat fresh from a thread."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self._stop = threading.Event()
        self._state = "running"
        self._detail = ""
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def _write(self) -> None:
        write_json(self.uri, {"state": self._state, "heartbeat": time.time(), "detail": self._detail})

    def _beat(self) -> None:
        while not self._stop.wait(STATUS_INTERVAL):
            self._write()

    def __enter__(self) -> StatusPublisher:
        self._write()
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._state, self._detail = ("failed", str(exc).splitlines()[0][:300]) if exc_type else ("succeeded", "")
        self._write()


def wait_for_chief(uri: str, startup_timeout: float, chief_timeout: float, what: str) -> int:
    """A server's side: polls the chief's status; returns the exit code this server should end with."""
    started = time.monotonic()
    while True:
        status = None
        if exists(uri):
            try:
                status = read_json(uri)
            except ValueError:
                status = None
        if status is None:
            if time.monotonic() - started > startup_timeout:
                print(f"error: {what}: the chief published no status at {uri} within {startup_timeout:g}s", flush=True)
                return EXIT_PEER_UNAVAILABLE
        elif status["state"] == "succeeded":
            log.info("%s: the chief finished successfully; exiting", what)
            return 0
        elif status["state"] == "failed":
            print(f"error: {what}: the chief failed: {status.get('detail', '')}", flush=True)
            return EXIT_FAILED
        elif time.time() - status["heartbeat"] > chief_timeout:
            age = time.time() - status["heartbeat"]
            print(f"error: {what}: the chief's heartbeat at {uri} is {age:.0f}s old (limit {chief_timeout:g}s); the chief vanished",
                  flush=True)
            return EXIT_PEER_UNAVAILABLE
        time.sleep(POLL_INTERVAL)


def run_server(tf_config: dict[str, Any], status_uri: str, startup_timeout: float, chief_timeout: float) -> int:
    """Runs this ps or worker task's server until the chief's status says the job is over."""
    import tensorflow as tf

    task = tf_config["task"]
    what = f"{task['type']} {task['index']}"
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    tf.distribute.Server(resolver.cluster_spec(), job_name=task["type"], task_index=task["index"], protocol="grpc", start=True)
    log.info("%s: server started at %s (pid %d); waiting for the chief", what, cluster_lib.own_address(tf_config), os.getpid())
    return wait_for_chief(status_uri, startup_timeout, chief_timeout, what)


def make_dataset_creator(data_dir: str, meta: dict[str, Any], batch_size: int, seed: int, shuffle_buffer: int) -> Any:
    import tensorflow as tf
    import tf_keras as keras

    from trainer.records import decode_fn, shard_paths

    files = shard_paths(data_dir, meta, "train")
    shape = tuple(meta["image_shape"])

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.TFRecordDataset(files).map(decode_fn(shape))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id).cache()
        ds = ds.shuffle(shuffle_buffer, seed=seed).repeat().map(lambda x, y: (tf.cast(x, tf.float32), y))
        return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return keras.utils.experimental.DatasetCreator(dataset_fn)


def run_chief(config: Any, tf_config: dict[str, Any], meta: dict[str, Any], status_uri: str) -> dict[str, Any]:
    """Coordinates training under ParameterServerStrategy and exports the model like the mirrored path."""
    import tensorflow as tf

    from trainer.model import build_model
    from trainer.train import ThroughputHistory, save_model
    from trainer.watchdog import StartupWatchdog

    with StatusPublisher(status_uri):
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        with StartupWatchdog(tf_config, config.startup_timeout, what="connecting to the parameter servers"):
            strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        workers = len(tf_config["cluster"]["worker"])
        steps = config.steps_per_epoch or max(1, meta["splits"]["train"]["num_examples"] // config.batch_size)
        image_shape = tuple(meta["image_shape"])
        with strategy.scope():
            model = build_model(image_shape, meta["num_classes"], config.learning_rate)
        throughput = ThroughputHistory(steps * config.batch_size)
        log.info("chief: %d epochs x %d steps of %d examples over %d workers and %d parameter servers", config.epochs, steps,
                 config.batch_size, workers, len(tf_config["cluster"]["ps"]))
        try:
            model.fit(make_dataset_creator(config.data_dir, meta, config.batch_size, config.seed, config.shuffle_buffer), epochs=config.epochs,
                      steps_per_epoch=steps, callbacks=[throughput.callback], verbose=0)
        except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as err:
            raise PeerUnavailableError(f"lost a parameter server during training: {err.message.strip().splitlines()[0][:300]}") from None
        history = {"epochs": throughput.epochs, "workers": workers, "parameter_servers": len(tf_config["cluster"]["ps"]),
                   "strategy": "parameter_server", "global_batch_size": config.batch_size, "steps_per_epoch": steps,
                   "learning_rate": config.learning_rate, "dataset": meta.get("source"), "class_names": meta["class_names"],
                   "image_shape": list(image_shape)}
        save_model(model, image_shape, config.model_dir, history)
    return history


def status_uri(config: Any) -> str:
    """`--status-uri`, or MODEL_DIR.status.json beside the model when not given."""
    return config.status_uri or f"{config.model_dir.rstrip('/')}.status.json"

