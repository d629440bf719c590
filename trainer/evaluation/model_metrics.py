"""Evaluation of a model_fn's model: the metrics it was compiled with, on the held-out split.

The chief's `model.keras` is loaded with its compile configuration (its loss and metrics; custom objects must be
registered with `tf_keras.saving.register_keras_serializable` in your module) and `evaluate`d on the prepared
dataset's test split. The serving check (`trainer.serving.serving_check.run_outputs`) then holds the exported
SavedModel, served the way TF Serving serves it, to the same model's predictions.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import exists
from trainer.evaluation.results import Sample

log = logging.getLogger(__name__)

BATCH = 256


@dataclasses.dataclass(frozen=True)
class ModelEvaluation:
    """A model_fn's model's results on a held-out split.

    Attributes:
        metrics: every metric the model was compiled with, by name (`loss`, `auc`, `accuracy`, ...).
        num_examples: examples evaluated.
        dataset: the prepared dataset's source.
        split: the split evaluated.
    """

    metrics: Mapping[str, float]
    num_examples: int
    dataset: str | None = None
    split: str = "test"

    def scalars(self) -> dict[str, float]:
        """The metrics a gate can name (a diverged model's may be NaN: it fails any gate)."""
        return dict(self.metrics)

    def confusion(self) -> None:
        """No confusion matrix: the model's task is its own."""
        return None

    def classes(self) -> tuple[dict[str, Any], ...]:
        """No per-class results: the model's task is its own."""
        return ()

    def to_json(self) -> dict[str, Any]:
        """The results as plain JSON-ready values."""
        return {**dataclasses.asdict(self), "metrics": dict(self.metrics)}


def evaluate_model(model_dir: str, data_dir: str, examples: int, split: str = "test") -> tuple[ModelEvaluation, Sample]:
    """The compiled metrics of `model_dir/model.keras` on `split`, and its predictions for the first `examples`.

    The predictions are by the model's `output_names`, which tf-keras gives the SavedModel's serving signature's
    outputs.

    Metrics that are not one number (a per-class F1, say) are left out, with a log line: a gate and KFP's Metrics
    artifact take scalars.

    Raises:
        UsageError: the model directory holds no model.keras, or it cannot be loaded (a custom object its module did
            not register).
    """
    import tensorflow as tf
    import tf_keras as keras

    from trainer.data import inputs
    from trainer.records.dataset import DatasetMetadata
    from trainer.records.model_dir import KERAS_FILE

    path = f"{model_dir.rstrip('/')}/{KERAS_FILE}"
    if not exists(path):
        raise UsageError(f"model directory {model_dir!r} has no {KERAS_FILE}; allowed: a directory the chief wrote")
    try:
        model = keras.models.load_model(path)
    except (TypeError, ValueError) as err:
        raise UsageError(
            f"{path!r} cannot be loaded ({str(err).splitlines()[0][:300]}); allowed: a model whose custom layers, "
            "losses and metrics are registered with tf_keras.saving.register_keras_serializable in model_fn's module"
        ) from None
    meta = DatasetMetadata.read(data_dir)
    data = inputs.examples(data_dir, meta, split)
    results = model.evaluate(data.batch(BATCH), return_dict=True, verbose=0)
    vectors = sorted(name for name, value in results.items() if np.ndim(value) != 0)
    if vectors:
        log.info("left out of the evaluation, not one number each: %s", ", ".join(vectors))
    features = next(iter(data.batch(examples)))[0]
    outputs = model(features, training=False)
    if not isinstance(outputs, dict):
        outputs = dict(zip(model.output_names, tf.nest.flatten(outputs), strict=True))
    predictions = {name: np.asarray(value) for name, value in outputs.items()}
    features = tf.nest.map_structure(lambda t: t.numpy(), features)
    evaluation = ModelEvaluation(
        metrics={name: _rounded(value) for name, value in sorted(results.items()) if name not in vectors},
        num_examples=meta.split(split, data_dir).num_examples,
        dataset=meta.source,
        split=split,
    )
    log.info(
        "%s on %d %s examples",
        ", ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()),
        evaluation.num_examples,
        split,
    )
    return evaluation, Sample(features, predictions)


def _rounded(value: Any) -> float:
    number = float(value)
    return round(number, 6) if math.isfinite(number) else number


def run(model_dir: str, data_dir: str, output: str | None = None, split: str = "test") -> ModelEvaluation:
    """Evaluates a model_fn's model in `model_dir` on `split` of `data_dir`; writes its metrics JSON to `output`."""
    from trainer.core.files import write_json

    evaluation, _ = evaluate_model(model_dir, data_dir, 1, split)
    if output:
        write_json(output, evaluation.to_json())
    return evaluation
