"""The chief's export: saved_model/ (a serving signature), model.keras and history.json, all or nothing."""

from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any

from trainer.core.files import atomic_directory
from trainer.modeling.kind import ModelKind
from trainer.records.history import History
from trainer.records.model_dir import KERAS_FILE, SAVED_MODEL_DIR

log = logging.getLogger(__name__)


def _save(model: Any, kind: ModelKind, directory: str, history: History) -> None:
    """The SavedModel with the kind's serving signature (`ModelKind.signatures`), model.keras, history.json."""
    import tensorflow as tf

    tf.saved_model.save(model, f"{directory}/{SAVED_MODEL_DIR}", signatures=kind.signatures(model))
    model.save(f"{directory}/{KERAS_FILE}")
    history.write(directory)


def save_model(model: Any, kind: ModelKind, model_dir: str, history: History) -> None:
    """Writes the model of `kind` to `model_dir` through a temporary sibling: a failed save leaves nothing behind."""
    with atomic_directory(model_dir) as tmp:
        _save(model, kind, tmp, history)
    log.info("chief wrote the model to %s", model_dir)


def save_and_discard(model: Any, kind: ModelKind, history: History) -> None:
    """A non-chief worker's part of the export: saved, then thrown away.

    Under MultiWorkerMirroredStrategy every worker must take part in saving (it runs collective ops), but only the
    chief keeps the result.
    """
    scratch = tempfile.mkdtemp(prefix="trainer-worker-")
    try:
        _save(model, kind, scratch, history)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
