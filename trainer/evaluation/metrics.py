"""Evaluation of an exported SavedModel (not the Python model code) on the held-out split."""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import exists, write_json
from trainer.data.tfrecords import read_arrays
from trainer.modeling.export import SAVED_MODEL_DIR

log = logging.getLogger(__name__)


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


def compute_metrics(probabilities: np.ndarray, labels: np.ndarray, class_names: list[str]) -> dict[str, Any]:
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
    return {
        "accuracy": round(accuracy, 6),
        "loss": round(loss, 6),
        "num_examples": int(len(labels)),
        "class_names": list(class_names),
        "per_class": per_class,
        "confusion_matrix": confusion.tolist(),
    }


def evaluate_split(model_dir: str, data_dir: str, split: str = "test") -> tuple[dict[str, Any], Any, Any]:
    """The metrics of the SavedModel in `model_dir` on `split`, with the split's images and the probabilities."""
    path = saved_model_path(model_dir)
    images, labels, meta = read_arrays(data_dir, split)
    probabilities = predict(path, images)
    metrics = compute_metrics(probabilities, labels, meta["class_names"])
    metrics["dataset"] = meta.get("source")
    metrics["split"] = split
    return metrics, images, probabilities


def run(model_dir: str, data_dir: str, output: str | None = None, split: str = "test") -> dict[str, Any]:
    """Evaluates the SavedModel in `model_dir` on `split` of `data_dir`; writes the metrics JSON to `output`."""
    metrics, _, _ = evaluate_split(model_dir, data_dir, split)
    if output:
        write_json(output, metrics)
    log.info(
        "test accuracy %.4f, loss %.4f on %d examples", metrics["accuracy"], metrics["loss"], metrics["num_examples"]
    )
    return metrics
