"""The training process's teardown (`trainer.training.teardown`): `fit` trains from the kept input, which outlives it.

The process-level half (every worker reaches the barrier and leaves with the input undestroyed, its outputs whole)
is checked on a real 2-worker run in tests/test_training.py.
"""

import numpy as np
import tensorflow as tf
import tf_keras as keras

from trainer.training.teardown import Teardown


def _batches():
    x = np.arange(40, dtype="float32").reshape(40, 1)
    return tf.data.Dataset.from_tensor_slices((x, 2 * x)).batch(1).repeat()


def test_fit_trains_from_the_kept_iterator_and_it_stays_where_fit_left_it():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    teardown = Teardown()
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(1e-4), "mse")
    history = model.fit(teardown.keep(strategy, _batches(), 0, 1), epochs=3, steps_per_epoch=4, verbose=0)
    assert len(history.history["loss"]) == 3
    assert len(teardown.iterators) == 1, "one iterator for the whole fit, as keras makes for an endless dataset"
    features, _ = next(teardown.iterators[0])
    assert float(strategy.experimental_local_results(features)[0][0, 0]) == 12.0, "fit took 3 x 4 batches from it"


def test_a_failed_process_or_one_with_nothing_kept_ends_the_ordinary_way():
    assert Teardown().leave(0) == 0
    assert Teardown(iterators=[object()]).leave(3) == 3


class Coordination:
    """A coordination service's client as TensorFlow's eager context is one: a barrier and a key-value store.

    `barrier` and `insert` are what the service answers (None: success, else the error raised); `store` holds the
    keys set, and `asked` the keys rank 0 waited for, in order.
    """

    def __init__(self, barrier=None, insert=None, store=None):
        self.barrier, self.insert = barrier, insert
        self.store = dict(store or {})
        self.asked = []

    def wait_at_barrier(self, barrier_id, timeout_in_ms):
        assert (barrier_id, timeout_in_ms) == ("trainer-leave", 600_000)
        if self.barrier:
            raise self.barrier

    def set_config_key_value(self, key, value):
        self.store[key] = value
        if self.insert:
            raise self.insert

    def get_config_key_value(self, key, timeout_in_ms=0):
        self.asked.append((key, timeout_in_ms))
        if key not in self.store:
            raise tf.errors.DeadlineExceededError(None, None, f"{key} not set")
        return self.store[key]


def test_a_worker_whose_word_that_it_leaves_is_cut_off_after_the_barrier_still_leaves_together():
    closed = tf.errors.UnavailableError(None, None, 'Error received from peer {grpc_message:"Socket closed"}')
    service = Coordination(insert=closed)
    assert Teardown(iterators=[object()], rank=1, workers=2).together(service)
    assert service.store == {"trainer-left/1": "left"} and service.asked == []


def test_rank_0_waits_for_every_other_worker_to_say_it_leaves_and_leaves_without_one_that_does_not():
    service = Coordination(store={"trainer-left/1": "left", "trainer-left/3": "left"})
    assert Teardown(left_timeout_s=2, rank=0, workers=4).together(service)
    assert service.asked == [(f"trainer-left/{rank}", 2000) for rank in (1, 2, 3)]


def test_a_failed_barrier_ends_the_process_the_ordinary_way():
    crashed = tf.errors.UnavailableError(None, None, "task /job:worker/task:0 heartbeat timeout")
    for rank in (0, 1):
        service = Coordination(barrier=crashed)
        assert Teardown(iterators=[object()], rank=rank, workers=2).leave(0, service) == 0
        assert service.store == {} and service.asked == []
