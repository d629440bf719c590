"""Users' data at the shapes module mode meets: token sequences of many lengths, images of two sizes, a table."""

import numpy as np
import tensorflow as tf
import tf_keras as keras


def tokens(split):
    """A text dataset tokenised without padding: every sentence as long as it is."""
    lengths = [12, 12, 7, 30] if split == "train" else [5, 9]

    def sentences():
        for n, length in enumerate(lengths):
            yield {"tokens": np.arange(length, dtype="int64"), "chars": np.int64(length * 5)}, n % 2

    signature = {"tokens": tf.TensorSpec([None], tf.int64), "chars": tf.TensorSpec([], tf.int64)}
    return tf.data.Dataset.from_generator(sentences, output_signature=(signature, tf.TensorSpec([], tf.int64)))


def images(split):
    """Photos as they came off two cameras: 28 x 28 and 32 x 32."""

    def photos():
        for n in range(6):
            side = 28 if n < 4 else 32
            yield np.zeros((side, side, 3), "uint8"), n % 3

    spec = (tf.TensorSpec([None, None, 3], tf.uint8), tf.TensorSpec([], tf.int64))
    return tf.data.Dataset.from_generator(photos, output_signature=spec)


def tabular(split):
    """A table of patients from a generator whose spec leaves the visits' length open, though every row has 4."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    n = 256 if split == "train" else 64
    age = rng.uniform(20, 80, n).astype("float32")
    visits = rng.uniform(0, 1, (n, 4)).astype("float32")
    label = ((age - 50) / 30 + visits.sum(axis=1) - 2 > 0).astype("float32")

    def rows():
        for i in range(n):
            yield {"age": age[i], "visits": visits[i], "ward": "north" if i % 2 else "south"}, label[i]

    signature = {
        "age": tf.TensorSpec([], tf.float32),
        "visits": tf.TensorSpec([None], tf.float32),
        "ward": tf.TensorSpec([], tf.string),
    }
    return tf.data.Dataset.from_generator(rows, output_signature=(signature, tf.TensorSpec([], tf.float32)))


def tabular_model(features):
    """A logistic model over the numeric columns, reporting the area under the precision-recall curve as pr-auc."""
    inputs = {name: keras.Input(shape=spec.shape, dtype=spec.dtype, name=name) for name, spec in features.items()}
    numeric = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs["age"]), inputs["visits"]])
    outputs = keras.layers.Dense(1, activation="sigmoid", name="sick")(keras.layers.Normalization()(numeric))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(curve="PR", name="pr-auc"), "accuracy"],
    )
    return model


CALLS: dict[str, int] = {}


def _count(name):
    CALLS[name] = CALLS.get(name, 0) + 1
    return CALLS[name]


def flaky(split):
    """A function whose store fails its first two calls (OSError), then answers."""
    if _count("flaky") <= 2:
        raise OSError(f"Input/output error reading gs://bucket/{split}.csv")
    return tabular(split)


def flaky_reading(split):
    """A function whose dataset loses its connection after 10 rows on the first two reads, then reads through."""
    attempt = _count("flaky_reading")
    table = tabular(split)

    def rows():
        for n, row in enumerate(table.as_numpy_iterator()):
            if n == 10 and attempt <= 2:
                raise ConnectionResetError("connection reset by peer")
            yield row

    return tf.data.Dataset.from_generator(rows, output_signature=table.element_spec)


def always_down(split):
    """A function whose store never answers."""
    raise ConnectionError(f"connection refused by data.example:443 for {split}")


def flaky_model(features):
    """A model function that fails once loading its weights (OSError), then builds the tabular model."""
    if _count("flaky_model") <= 1:
        raise OSError("Input/output error reading gs://bucket/weights.h5")
    return tabular_model(features)
