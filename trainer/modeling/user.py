"""Your own model (`model_fn`): a function of the features' spec that returns a compiled tf-keras model; its kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainer.core.errors import UsageError
from trainer.evaluation.results import Sample
from trainer.modeling.kind import Compiled, ModelKind


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
            "(import tf_keras as keras, or tf.keras unless TF_USE_LEGACY_KERAS is 0: Keras 3 cannot train "
            "under MultiWorkerMirroredStrategy)"
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


class UserModel(ModelKind):
    """Your own model (`model_fn`) on either dataset format.

    Compiled by your function, exported with its own inputs and outputs, evaluated on the metrics it was compiled
    with, and checked served against its own predictions.
    """

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.name = f"model_fn {spec!r}"
        self.function: Callable[[Any], Any] | None = None

    @classmethod
    def claims(cls, model: Any) -> bool:
        """Whether a model_fn is set."""
        return bool(model.model_fn)

    @classmethod
    def of(cls, model: Any) -> UserModel:
        """The kind of the model_fn the settings name."""
        return cls(model.model_fn)

    def check_settings(self, *, strategy: str = "", source: str = "", gate: str = "") -> None:
        """Refuses any strategy but multi_worker_mirrored (the parameter-server runner trains only the CNN)."""
        if strategy and strategy != "multi_worker_mirrored":
            raise UsageError(
                f"model_fn {self.spec!r} is not allowed with strategy {strategy!r}; allowed: multi_worker_mirrored"
            )

    def load(self) -> None:
        """Imports the function (its module must not run TensorFlow ops when imported)."""
        from trainer.core.functions import load

        self.function = load(self.spec, self.name)

    def build(self, reader: Any, compiled: Compiled, gate: Any) -> Any:
        """`model_fn(features spec)`, checked; then the gate's metric among those it reports (one example built)."""
        from trainer.data.inputs import examples, features_spec

        if self.function is None:
            self.load()
        model = build_user_model(self.function, self.spec, features_spec(reader.data_dir, reader.meta, reader))
        if gate is not None:
            one = next(iter(examples(reader.data_dir, reader.meta, "train", reader).batch(1)))
            gate.check_reported(reported_metrics(model, one, self.spec), self.name)
        return model

    def signatures(self, model: Any) -> None:
        """None: the model's own inputs and outputs."""
        return None

    def evaluate(self, model_dir: str, data_dir: str, examples: int, split: str = "test") -> tuple[Any, Sample]:
        """The compiled metrics of the chief's model.keras, and its predictions for the first examples."""
        from trainer.evaluation.model_metrics import evaluate_model

        return evaluate_model(model_dir, data_dir, examples, split)

    def serving_check(self, saved_model_dir: str, sample: Sample) -> Any:
        """`trainer.serving.serving_check.run_outputs`: the served answers equal the Keras model's predictions."""
        from trainer.serving import serving_check

        return serving_check.run_outputs(saved_model_dir, sample.features, sample.predictions)

    def html_name(self) -> str:
        """`model <code>package.module:function</code>`."""
        import html

        return f"model <code>{html.escape(self.spec)}</code>"
