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
"""

from __future__ import annotations

from typing import Any


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
