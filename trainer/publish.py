"""Publishing a model that passed the quality gate: a versioned copy under a `tf.io.gfile` URI, with its metrics.

Layout under `publish_uri` (TF Serving reads the integer version directories as they are):

    publish_uri/1796222222/saved_model.pb, variables/, metrics.json
    publish_uri/latest.json      -> {"version": 1796222222, "path": ..., "metrics": {...}, "lineage": {...}}

A version directory is copied into a temporary sibling and renamed when complete; `latest.json` is replaced
through a temporary file. A model whose accuracy is below the one in `latest.json` is not published.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from trainer.atomic import exists, read_json, write_json
from trainer.errors import UsageError

log = logging.getLogger(__name__)

LATEST = "latest.json"


def _copy_tree(src: str, dst: str) -> None:
    import tensorflow as tf

    for root, _, files in tf.io.gfile.walk(src):
        rel = root[len(src) :].lstrip("/")
        target = f"{dst}/{rel}" if rel else dst
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(f"{root}/{name}", f"{target}/{name}", overwrite=True)


def latest(publish_uri: str) -> dict[str, Any] | None:
    """The published record `latest.json` names, or None when nothing is published."""
    path = f"{publish_uri.rstrip('/')}/{LATEST}"
    return read_json(path) if exists(path) else None


def publish(saved_model_dir: str, metrics: dict[str, Any], publish_uri: str, lineage: dict[str, Any]) -> dict[str, Any]:
    """Publishes unless the currently published model is better; returns the decision (published, reason, version)."""
    import tensorflow as tf

    if not publish_uri:
        raise UsageError(
            "publish_uri is empty; give a local path or a tf.io.gfile URI such as gs://bucket/models/mnist"
        )
    if not exists(f"{saved_model_dir}/saved_model.pb"):
        raise UsageError(f"model directory {saved_model_dir!r} holds no SavedModel")
    root = publish_uri.rstrip("/")
    previous = latest(root)
    accuracy = float(metrics["accuracy"])
    if previous is not None and accuracy < float(previous["metrics"]["accuracy"]):
        reason = (
            f"not published: accuracy {accuracy:.4f} is below the published version {previous['version']} "
            f"({float(previous['metrics']['accuracy']):.4f})"
        )
        log.info(reason)
        return {"published": False, "reason": reason, "version": None, "previous": previous}
    tf.io.gfile.makedirs(root)
    version = int(time.time())
    while exists(f"{root}/{version}"):
        version += 1
    final = f"{root}/{version}"
    tmp = f"{root}/.tmp-{version}"
    record = {"version": version, "path": final, "metrics": metrics, "lineage": lineage}
    try:
        _copy_tree(saved_model_dir, tmp)
        write_json(f"{tmp}/metrics.json", record)
        tf.io.gfile.rename(tmp, final)
    except BaseException:
        if exists(tmp):
            tf.io.gfile.rmtree(tmp)
        raise
    write_json(f"{root}/{LATEST}", record)
    reason = f"published version {version} with accuracy {accuracy:.4f}" + (
        f" (previous {float(previous['metrics']['accuracy']):.4f})" if previous else " (first version)"
    )
    log.info(reason)
    return {"published": True, "reason": reason, "version": version, "path": final, "previous": previous}
