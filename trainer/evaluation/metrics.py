"""The built-in CNN's evaluation: its exported SavedModel (not the Python model code) on the held-out split.

`Evaluation` is its record of the one evaluation protocol (`trainer.evaluation.results.Results`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import exists, write_json
from trainer.data.tfrecords import read_arrays
from trainer.records.model_dir import SAVED_MODEL_DIR

log = logging.getLogger(__name__)

CNN_METRICS = ("accuracy", "loss")


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A model's results on a held-out split: what metrics.json holds.

    Attributes:
        accuracy: the share of examples whose most probable class is the label.
        loss: mean cross-entropy of the label's probability (clipped at 1e-7).
        num_examples: examples evaluated.
        class_names: the classes, in label order.
        per_class: per class: `class`, `name`, `precision`, `recall`, `f1`, `support`.
        confusion_matrix: rows are the true class, columns the predicted one.
        dataset: the prepared dataset's source; None when not known.
        split: the split evaluated.
    """

    accuracy: float
    loss: float
    num_examples: int
    class_names: tuple[str, ...]
    per_class: tuple[dict[str, Any], ...]
    confusion_matrix: tuple[tuple[int, ...], ...]
    dataset: str | None = None
    split: str = "test"

    def scalars(self) -> dict[str, float]:
        """The metrics a gate can name: `accuracy` and `loss` (CNN_METRICS)."""
        return {name: getattr(self, name) for name in CNN_METRICS}

    def confusion(self) -> tuple[list[str], list[list[int]]]:
        """The class names and the confusion matrix as the Kubeflow UI's ClassificationMetrics takes them."""
        return list(self.class_names), [list(row) for row in self.confusion_matrix]

    def classes(self) -> tuple[dict[str, Any], ...]:
        """Per class: `class`, `name`, `precision`, `recall`, `f1`, `support`."""
        return self.per_class

    def to_json(self) -> dict[str, Any]:
        """The results as metrics.json holds them."""
        return {
            **dataclasses.asdict(self),
            "class_names": list(self.class_names),
            "per_class": [dict(c) for c in self.per_class],
            "confusion_matrix": [list(row) for row in self.confusion_matrix],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evaluation:
        """The results from metrics.json's content."""
        return cls(
            accuracy=float(data["accuracy"]),
            loss=float(data["loss"]),
            num_examples=int(data["num_examples"]),
            class_names=tuple(data["class_names"]),
            per_class=tuple(data["per_class"]),
            confusion_matrix=tuple(tuple(row) for row in data["confusion_matrix"]),
            dataset=data.get("dataset"),
            split=data.get("split", "test"),
        )


def saved_model_path(model_dir: str) -> str:
    """`model_dir/saved_model` as the trainer writes it, or `model_dir` itself if it is a SavedModel."""
    for candidate in (f"{model_dir.rstrip('/')}/{SAVED_MODEL_DIR}", model_dir):
        if exists(f"{candidate}/saved_model.pb"):
            return candidate
    raise UsageError(
        f"model directory {model_dir!r} holds no SavedModel (looked for saved_model.pb in it and in {SAVED_MODEL_DIR}/)"
    )


def predict(model_dir: str, images: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Class probabilities from the SavedModel's serving signature for uint8 images `[n, h, w, c]`."""
    import tensorflow as tf

    serve = tf.saved_model.load(saved_model_path(model_dir)).signatures["serving_default"]
    spec = serve.structured_input_signature[1]["images"]
    if len(spec.shape) == 3:
        images = images[..., 0]
    out = [
        serve(images=tf.constant(images[i : i + batch_size]))["probabilities"].numpy()
        for i in range(0, len(images), batch_size)
    ]
    return np.concatenate(out)


def compute_metrics(probabilities: np.ndarray, labels: np.ndarray, class_names: list[str]) -> Evaluation:
    """Accuracy, cross-entropy loss, per-class precision/recall/F1 and the confusion matrix (rows: true class)."""
    n = len(class_names)
    predicted = probabilities.argmax(axis=1)
    confusion = np.zeros((n, n), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    eps = 1e-7
    loss = float(-np.mean(np.log(np.clip(probabilities[np.arange(len(labels)), labels], eps, 1.0))))
    per_class = []
    for k, name in enumerate(class_names):
        tp = int(confusion[k, k])
        predicted_k = int(confusion[:, k].sum())
        support = int(confusion[k, :].sum())
        precision = tp / predicted_k if predicted_k else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append(
            {
                "class": k,
                "name": name,
                "precision": round(precision, 6),
                "recall": round(recall, 6),
                "f1": round(f1, 6),
                "support": support,
            }
        )
    accuracy = float(np.trace(confusion) / max(1, len(labels)))
    if not math.isfinite(loss):
        loss = float("nan")
    return Evaluation(
        accuracy=round(accuracy, 6),
        loss=round(loss, 6),
        num_examples=int(len(labels)),
        class_names=tuple(class_names),
        per_class=tuple(per_class),
        confusion_matrix=tuple(tuple(int(v) for v in row) for row in confusion.tolist()),
    )


def evaluate_split(model_dir: str, data_dir: str, split: str = "test") -> tuple[Evaluation, Any, Any]:
    """The results of the SavedModel in `model_dir` on `split`, with the split's images and the probabilities."""
    path = saved_model_path(model_dir)
    images, labels, meta = read_arrays(data_dir, split)
    probabilities = predict(path, images)
    evaluation = compute_metrics(probabilities, labels, list(meta.class_names))
    evaluation = dataclasses.replace(evaluation, dataset=meta.source, split=split)
    log.info("test accuracy %.4f, loss %.4f on %d examples", evaluation.accuracy, evaluation.loss, len(images))
    return evaluation, images, probabilities


def evaluate(model_dir: str, data_dir: str, output: str | None = None, split: str = "test") -> Evaluation:
    """Evaluates the SavedModel in `model_dir` on `split` of `data_dir`; writes metrics.json to `output`."""
    evaluation, _, _ = evaluate_split(model_dir, data_dir, split)
    if output:
        write_json(output, evaluation.to_json())
    return evaluation
