"""Your own model (`model_fn`): a function of the features' spec that returns a compiled tf-keras model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.core.errors import UsageError


def build_user_model(function: Callable[[Any], Any], spec: str, features: Any) -> Any:
    """`function(features)`, checked: a tf-keras model, compiled.

    Called inside the strategy's scope, so its variables are mirrored. The model keeps the optimizer, loss and
    metrics it was compiled with; evaluation reports those metrics and the gate can name any of them.

    Args:
        function: the imported model_fn.
        spec: its `package.module:function`, for messages.
        features: the `tf.TensorSpec` (or dict of them) of one example's features, without the batch dimension.

    Raises:
        UsageError: it returned something else, or a model that is not compiled.
    """
    import tf_keras as keras

    from trainer.core.functions import call

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
