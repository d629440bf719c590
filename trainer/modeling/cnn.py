"""The built-in CNN, its serving signature and its model kind.

tf-keras (Keras 2): Keras 3 `fit` fails under MultiWorkerMirroredStrategy.
"""

from __future__ import annotations

from typing import Any

from trainer.evaluation.results import Sample
from trainer.modeling.kind import Compiled, ModelKind


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
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="probabilities", dtype="float32")(x)
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


class BuiltInCnn(ModelKind):
    """The built-in CNN on TFRecord images.

    Compiled by the trainer, exported for raw uint8 images, evaluated on accuracy, loss and per class from its
    SavedModel, and checked served on `probabilities` and `class_ids`.
    """

    name = "the built-in CNN"

    @classmethod
    def claims(cls, model: Any) -> bool:
        """Every model no other kind claims."""
        return True

    @classmethod
    def of(cls, model: Any) -> BuiltInCnn:
        """The built-in CNN (it has no settings of its own)."""
        return cls()

    def check_settings(self, *, strategy: str = "", source: str = "", gate: str = "") -> None:
        """Refuses a source of your function's examples, and a gate on a metric other than accuracy and loss."""
        from trainer.config.gate import Gate
        from trainer.core.errors import UsageError
        from trainer.evaluation.metrics import CNN_METRICS

        if source.startswith("fn:"):
            raise UsageError(
                f"source {source!r} is not allowed without model_fn: the built-in CNN trains on images; allowed: "
                "--model-fn package.module:function naming your model"
            )
        if Gate.of(gate, 0).metric not in CNN_METRICS:
            raise UsageError(
                f"gate {gate!r} is not allowed with the built-in CNN, which reports "
                f"{' and '.join(CNN_METRICS)}; allowed: a gate on one of them, or --model-fn naming a model compiled "
                f"with {Gate.of(gate, 0).metric!r}"
            )

    def check_data(self, data_dir: str, meta: Any) -> None:
        """Refuses a dataset that is not TFRecord images (your function's saved examples)."""
        from trainer.core.errors import UsageError
        from trainer.records.dataset import IMAGES

        if meta.format != IMAGES:
            raise UsageError(
                f"dataset {data_dir!r} was prepared from source {meta.source!r}, whose features the built-in "
                "CNN cannot train on; allowed: model_fn naming your model's function, with strategy "
                "multi_worker_mirrored"
            )

    def build(self, reader: Any, compiled: Compiled, gate: Any) -> Any:
        """The CNN for the dataset's image shape and classes, its learning rate on a cosine over the run."""
        from trainer.evaluation.metrics import CNN_METRICS

        if gate is not None:
            gate.check_reported(CNN_METRICS, self.name)
        return build_model(
            reader.meta.image_shape,
            reader.meta.num_classes,
            compiled.learning_rate,
            decay_steps=compiled.decay_steps,
            steps_per_execution=compiled.steps_per_execution,
        )

    def learning_rate(self, model: Any, configured: float) -> float:
        """The peak learning rate the trainer compiled it with."""
        return configured

    def recorded_learning_rate(self, setting: float, used: float) -> float:
        """The learning_rate setting (before the runner scaled it by the worker count)."""
        return setting

    def signatures(self, model: Any) -> dict[str, Any]:
        """`serving_default` on raw uint8 images of the model's input shape (`serving_function`)."""
        return {"serving_default": serving_function(model, tuple(model.input_shape[1:]))}

    def evaluate(self, model_dir: str, data_dir: str, examples: int, split: str = "test") -> tuple[Any, Sample]:
        """Accuracy, loss and per-class results of the exported SavedModel; the first images and probabilities."""
        from trainer.evaluation.metrics import evaluate_split

        results, images, probabilities = evaluate_split(model_dir, data_dir, split)
        count = min(len(images), examples)
        return results, Sample(images[:count], probabilities[:count])

    def serving_check(self, saved_model_dir: str, sample: Sample) -> Any:
        """`trainer.serving.serving_check.run`: the signature on images, probabilities, class ids, agreement."""
        from trainer.serving import serving_check

        return serving_check.run(saved_model_dir, sample.features, sample.predictions)
