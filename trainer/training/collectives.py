"""One collective per training step: the gradients' all-reduce, and no metric synchronisation between steps.

Under MultiWorkerMirroredStrategy tf-keras' `fit` synchronises the workers far more often than the gradients need:
every step's `train_step` returns `get_metrics_result()`, whose `metric.result()` all-reduces each metric's state
(`total` and `count`: two collectives per metric), and `reduce_per_replica` then sums each returned value across
workers (one more per metric). For a model compiled with a loss and one metric that is 7 all-reduces per step, 6 of
them scalars whose only use is a per-batch log line, each a round trip over gRPC that every worker must reach before
any goes on (docs/benchmarks.md has the cost).

`local_step_metrics(model)` makes the steps return each worker's own running metric values instead, without a
collective. The metrics' state is still updated every step, and at the end of every epoch `fit` (and `evaluate`)
read them outside the replica context, which aggregates them over all workers once: the epoch's logs, history and
TensorBoard scalars are what they were. Only per-batch logs (`on_train_batch_end`) become this worker's own.
Training is unchanged: the gradients are all-reduced exactly as before.

Which all-reduce the gradients' collective uses is decided from the worker's GPUs (`choose_devices`): NCCL on
GPUs, RING (gRPC between the workers' CPUs) otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from trainer.core.errors import UsageError


def local_results(model: Any) -> dict[str, Any]:
    """This worker's running metric values, read without `result()`'s aggregation across workers."""
    results: dict[str, Any] = {}
    for metric in model.metrics:
        # tf-keras wraps each metric instance's `result` to aggregate over replicas; the class's own method reads
        # the state variables as they are on this replica.
        value = type(metric).result(metric)
        if isinstance(value, dict):
            results.update(value)
        else:
            results[metric.name] = value
    return results


def local_step_metrics(model: Any) -> Any:
    """Makes `model`'s steps return unsynchronised metric values (see the module docstring); returns `model`.

    The model's own `train_step` and `test_step` run unchanged (a subclass's override too); `get_metrics_result`,
    which they call for their return value, answers with the local values inside a replica context and with the
    aggregated ones outside it, and `fit` keeps the local replica's outputs instead of all-reducing them.
    """
    import tensorflow as tf

    aggregated = model.get_metrics_result

    def get_metrics_result() -> dict[str, Any]:
        if tf.distribute.in_cross_replica_context():
            return aggregated()
        return local_results(model)

    model.get_metrics_result = get_metrics_result
    model.distribute_reduction_method = "first"
    return model


NCCL = "NCCL"
RING = "RING"
MIXED_FLOAT16 = "mixed_float16"


@dataclasses.dataclass(frozen=True)
class Devices:
    """The devices one worker trains on and the all-reduce it uses across workers.

    Attributes:
        gpus: the names of this worker's GPUs as TensorFlow lists them (`/physical_device:GPU:0`, ...); empty: CPU.
        communication: `NCCL` when the worker has GPUs, else `RING` (gRPC); a name of
            `tf.distribute.experimental.CommunicationImplementation`.
    """

    gpus: tuple[str, ...]
    communication: str

    @property
    def replicas(self) -> int:
        """Replicas this worker holds: one per GPU (MultiWorkerMirroredStrategy mirrors over them), else one."""
        return max(1, len(self.gpus))

    def describe(self) -> str:
        """For the worker's log line: `2 GPUs (/physical_device:GPU:0, ...), NCCL all-reduce`."""
        where = f"{len(self.gpus)} GPU{'s' * (len(self.gpus) != 1)} ({', '.join(self.gpus)})" if self.gpus else "CPU"
        return f"{where}, {self.communication} all-reduce"


def choose_devices(gpus: Sequence[Any]) -> Devices:
    """The devices and all-reduce of a worker whose GPUs are `gpus`.

    Args:
        gpus: `tf.config.list_physical_devices("GPU")`'s result (objects with a `name`).

    Every GPU of the pod is used by its one process (the strategy's local devices); NCCL needs a GPU on every worker,
    which holds in a pipeline (every training pod asks for the same GPUs) and under `trainer-launch
    --gpus-per-worker` (every worker gets the same number).
    """
    names = tuple(device.name for device in gpus)
    return Devices(names, NCCL if names else RING)


def precision_policy(setting: str, devices: Devices) -> str:
    """The tf-keras global policy to train under: `float32`, or `mixed_float16` on a worker with GPUs.

    Raises:
        UsageError: mixed_float16 on a worker without GPUs (on a CPU it is slower than float32, not faster).
    """
    if setting != MIXED_FLOAT16:
        return "float32"
    if not devices.gpus:
        raise UsageError(
            f"mixed_precision {setting!r} is not allowed on a worker without GPUs (TensorFlow lists none here); "
            "allowed: empty (float32), or mixed_float16 on workers with GPUs"
        )
    return MIXED_FLOAT16


def communication_options(devices: Devices, pack_bytes: int, timeout_seconds: float) -> Any:
    """MultiWorkerMirroredStrategy's communication options: the devices' all-reduce, packing and timeout."""
    import tensorflow as tf

    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=pack_bytes,
        timeout_seconds=timeout_seconds or None,
        implementation=getattr(tf.distribute.experimental.CommunicationImplementation, devices.communication),
    )
