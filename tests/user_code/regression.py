"""A user's module for module mode that is not classification: two named inputs, a regression target, MAE."""

import numpy as np
import tensorflow as tf
import tf_keras as keras


def datasets(split):
    """Y = 2a - b + noise, as ({"a": a, "b": b}, y) pairs; 512 training and 128 test examples."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    n = 512 if split == "train" else 128
    a, b = rng.uniform(-1, 1, n).astype("float32"), rng.uniform(-1, 1, (n, 2)).astype("float32")
    y = (2 * a - b[:, 0] + 0.5 * b[:, 1] + rng.normal(0, 0.05, n)).astype("float32")
    return tf.data.Dataset.from_tensor_slices(({"a": a, "b": b}, y))


def model(features):
    """A linear model over both inputs, compiled with MSE and MAE."""
    inputs = {name: keras.Input(shape=spec.shape, dtype=spec.dtype, name=name) for name, spec in features.items()}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs["a"]), inputs["b"]])
    outputs = keras.layers.Dense(1, name="y")(keras.layers.Dense(16, activation="relu")(joined))
    regression = keras.Model(inputs, outputs)
    regression.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return regression


def two_heads(features):
    """Two outputs, listed in an order their names do not sort in: the value, and whether it is positive (with a
    per-class F1, a metric that is not one number)."""
    inputs = {name: keras.Input(shape=spec.shape, dtype=spec.dtype, name=name) for name, spec in features.items()}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs["a"]), inputs["b"]])
    hidden = keras.layers.Dense(16, activation="relu")(joined)
    value = keras.layers.Dense(1, name="y_value")(hidden)
    positive = keras.layers.Dense(1, activation="sigmoid", name="a_positive")(hidden)
    heads = keras.Model(inputs, [value, positive])
    heads.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=["mse", "binary_crossentropy"],
        metrics=[["mae"], [keras.metrics.F1Score(threshold=0.5)]],
    )
    return heads


def two_heads_data(split):
    """The regression data with a second label: whether y is positive."""
    return datasets(split).map(lambda features, y: (features, (y, tf.cast(y > 0, tf.float32))))


def colliding(features):
    """The regression model with a metric named as the evaluate step's own record of the example count."""
    regression = model(features)
    regression.compile(optimizer="adam", loss="mse", metrics=[keras.metrics.MeanAbsoluteError(name="test_examples")])
    return regression
