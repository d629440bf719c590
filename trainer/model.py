"""The small CNN and its serving signature. tf-keras (Keras 2): Keras 3 `fit` fails under MultiWorkerMirroredStrategy."""

from __future__ import annotations

from typing import Any


def build_model(image_shape: tuple[int, int, int], num_classes: int, learning_rate: float, decay_steps: int = 0) -> Any:
    """A compiled CNN for `image_shape` inputs (float pixels 0-255) that outputs class probabilities.

    With `decay_steps`, the learning rate follows a cosine from `learning_rate` down to 5% of it over that many steps.
    """
    import tf_keras as keras

    inputs = keras.Input(shape=image_shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    x = keras.layers.Conv2D(32, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D()(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(0.3)(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    model = keras.Model(inputs, outputs, name="cnn")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps, alpha=0.05)
                                        if decay_steps else learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
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
