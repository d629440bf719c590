"""The chief's export: saved_model/ (a serving signature), model.keras and history.json, all or nothing."""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any

from trainer.core.files import atomic_directory
from trainer.training.history import History

log = logging.getLogger(__name__)

SAVED_MODEL_DIR = "saved_model"
KERAS_FILE = "model.keras"


def _save(model: Any, image_shape: tuple[int, int, int] | None, directory: str, history: History) -> None:
    """With an image shape: the CNN's signature on raw uint8 images; without: the model's own inputs and outputs."""
    import tensorflow as tf

    from trainer.modeling.cnn import serving_function

    signatures = {"serving_default": serving_function(model, image_shape)} if image_shape else None
    tf.saved_model.save(model, f"{directory}/{SAVED_MODEL_DIR}", signatures=signatures)
    model.save(f"{directory}/{KERAS_FILE}")
    history.write(directory)


def save_model(model: Any, image_shape: tuple[int, int, int] | None, model_dir: str, history: History) -> None:
    """Writes the model to `model_dir` through a temporary sibling: a failed save leaves nothing behind."""
    with atomic_directory(model_dir) as tmp:
        _save(model, image_shape, tmp, history)
    log.info("chief wrote the model to %s", model_dir)


def save_and_discard(model: Any, image_shape: tuple[int, int, int] | None, history: History) -> None:
    """A non-chief worker's part of the export: saved, then thrown away.

    Under MultiWorkerMirroredStrategy every worker must take part in saving (it runs collective ops), but only the
    chief keeps the result.
    """
    scratch = tempfile.mkdtemp(prefix="trainer-worker-")
    try:
        _save(model, image_shape, scratch, history)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
