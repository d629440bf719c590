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
