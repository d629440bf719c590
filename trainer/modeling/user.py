"""Your own model (`model_fn`): a function of the features' spec that returns a compiled tf-keras model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.core.errors import UsageError


def build_user_model(function: Callable[[Any], Any], spec: str, features: Any) -> Any:
    """`function(features)`, checked: a tf-keras model, compiled.

    Called inside the strategy's scope, so its variables are mirrored. The model keeps the optimizer, loss and
    metrics it was compiled with; evaluation reports those metrics and the gate can name any of them. An error the
    function raises is judged by `trainer.core.user_errors`: a transient one (an OSError while it loads weights, say)
    is retried with backoff and ends the task with 142 if it lasts; any other is bad input (2).

    Args:
        function: the imported model_fn.
        spec: its `package.module:function`, for messages.
        features: the `tf.TensorSpec` (or dict of them) of one example's features, without the batch dimension.

    Raises:
        UsageError: it raised a programming error, returned something else, or a model that is not compiled.
        StoreUnavailableError: it kept raising a transient error.
    """
    import tf_keras as keras

    from trainer.core.user_errors import call

    model = call(function, f"model_fn {spec!r}", features)
    if not isinstance(model, keras.Model):
        raise UsageError(
            f"model_fn {spec!r} returned {type(model).__module__}.{type(model).__name__}; allowed: a tf_keras.Model "
            "(import tf_keras as keras, or tf.keras with TF_USE_LEGACY_KERAS=1: Keras 3 cannot train under "
            "MultiWorkerMirroredStrategy)"
        )
    if getattr(model, "optimizer", None) is None or getattr(model, "compiled_loss", None) is None:
        raise UsageError(
            f"model_fn {spec!r} returned a model that is not compiled; allowed: a model after "
            "model.compile(optimizer=..., loss=..., metrics=[...])"
        )
    return model


def reported_metrics(model: Any, example: tuple[Any, Any], spec: str) -> list[str]:
    """The names of the metrics a compiled model reports (what `evaluate` returns), known before it is trained.

    tf-keras names its compiled loss and metrics (`loss`, `auc`, per output `y_value_mae`) only when it builds them
    from the first batch's predictions and labels; they are built here from one example, in the strategy's scope
    as `fit` would build them, so training keeps the same metric objects.

    Args:
        model: the model `build_user_model` returned.
        example: one batch of one example, `(features, label)`.
        spec: model_fn's `package.module:function`, for messages.

    Raises:
        UsageError: the model cannot take the example, or its loss or metrics do not fit its outputs and labels.
    """
    features, label = example
    try:
        if not (model.compiled_loss.built and model.compiled_metrics.built):
            predictions = model(features, training=False)
            model.compiled_loss.build(predictions)
            model.compiled_metrics.build(predictions, label)
    except (TypeError, ValueError) as err:
        from trainer.core.user_errors import one_line

        raise UsageError(
            f"model_fn {spec!r} returned a model that does not take the prepared examples: {one_line(err)}"
        ) from None
    return [metric.name for metric in model.metrics]
