"""The chief's export: saved_model/ (serving signature on raw images), model.keras and history.json, all or nothing."""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any

from trainer.config.contract import TrainConfig
from trainer.core.files import atomic_directory, write_json
from trainer.training.callbacks import run_log_dir

log = logging.getLogger(__name__)

SAVED_MODEL_DIR = "saved_model"
KERAS_FILE = "model.keras"
HISTORY_FILE = "history.json"


def _save(model: Any, image_shape: tuple[int, int, int], directory: str, history: dict[str, Any]) -> None:
    import tensorflow as tf

    from trainer.modeling.cnn import serving_function

    signatures = {"serving_default": serving_function(model, image_shape)}
    tf.saved_model.save(model, f"{directory}/{SAVED_MODEL_DIR}", signatures=signatures)
    model.save(f"{directory}/{KERAS_FILE}")
    write_json(f"{directory}/{HISTORY_FILE}", history)


def save_model(model: Any, image_shape: tuple[int, int, int], model_dir: str, history: dict[str, Any]) -> None:
    """Writes the model to `model_dir` through a temporary sibling: a failed save leaves nothing behind."""
    with atomic_directory(model_dir) as tmp:
        _save(model, image_shape, tmp, history)
    log.info("chief wrote the model to %s", model_dir)


def save_and_discard(model: Any, image_shape: tuple[int, int, int], history: dict[str, Any]) -> None:
    """A non-chief worker's part of the export: saved, then thrown away.

    Under MultiWorkerMirroredStrategy every worker must take part in saving (it runs collective ops), but only the
    chief keeps the result.
    """
    scratch = tempfile.mkdtemp(prefix="trainer-worker-")
    try:
        _save(model, image_shape, scratch, history)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def history_record(
    config: TrainConfig,
    meta: dict[str, Any],
    epochs: list[dict[str, Any]],
    workers: int,
    global_batch: int,
    steps: int,
    learning_rate: float,
) -> dict[str, Any]:
    """history.json: the per-epoch results and what produced them (the lineage a published model carries)."""
    return {
        "epochs": epochs,
        "workers": workers,
        "strategy": config.cluster.strategy,
        "global_batch_size": global_batch,
        "steps_per_epoch": steps,
        "learning_rate": learning_rate,
        "dataset": meta.get("source"),
        "class_names": meta["class_names"],
        "image_shape": list(meta["image_shape"]),
        "run_id": config.runtime.run_id,
        "tensorboard": run_log_dir(config.runtime.tensorboard_dir, config.runtime.run_id)
        if config.runtime.tensorboard_dir
        else "",
        "parameters": {
            "num_workers": workers,
            "epochs": config.optim.epochs,
            "batch_size": config.optim.batch_size,
            "learning_rate": config.optim.learning_rate,
            "seed": config.data.seed,
        },
    }
