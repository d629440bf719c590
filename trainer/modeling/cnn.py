"""The CNN and its serving signature. tf-keras (Keras 2): Keras 3 `fit` fails under MultiWorkerMirroredStrategy."""

from __future__ import annotations

from typing import Any


def build_model(
    image_shape: tuple[int, int, int],
    num_classes: int,
    learning_rate: float,
    decay_steps: int = 0,
    steps_per_execution: int = 1,
) -> Any:
    """A compiled CNN for `image_shape` inputs (float pixels 0-255) that outputs class probabilities.

    Two blocks of two 3x3 convolutions (24 then 48 filters, padded) each followed by 2x2 max-pooling, then dropout,
    a 128-unit layer and dropout; sized to pass 0.92 test accuracy on Fashion-MNIST within 5 epochs at global batch 128
    on 2 CPU cores (docs/benchmarks.md).

    With `decay_steps`, the learning rate follows a cosine from `learning_rate` down to 5% of it over that many steps.
    `steps_per_execution` steps run inside one call of the compiled training function (Keras' `compile` option).
    """
    import tf_keras as keras

    inputs = keras.Input(shape=image_shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    for filters in (24, 48):
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.4)(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(0.3)(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    model = keras.Model(inputs, outputs, name="cnn")
    model.compile(
        optimizer=keras.optimizers.Adam(
            learning_rate=keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps, alpha=0.05)
            if decay_steps
            else learning_rate
        ),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
        steps_per_execution=steps_per_execution,
    )
    return model


def serving_function(model: Any, image_shape: tuple[int, int, int]) -> Any:
    """A tf.function taking raw uint8 images (`[n, h, w]` for one channel, else `[n, h, w, c]`)."""
    import tensorflow as tf

    height, width, channels = image_shape
    spec_shape = [None, height, width] if channels == 1 else [None, height, width, channels]

    @tf.function(input_signature=[tf.TensorSpec(spec_shape, tf.uint8, name="images")])
    def serve(images):
        x = tf.cast(images, tf.float32)
        if channels == 1:
            x = x[..., tf.newaxis]
        probabilities = model(x, training=False)
        return {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1)}

    return serve
