"""A run's identity, and the key every place a run writes is named by.

A pipeline run's id is KFP's `dsl.PIPELINE_JOB_ID_PLACEHOLDER`: the same for every task of the run and for every
retry of a task, different for every run (a scheduled night, a re-submit, a sweep's trial). Its key (`r` + 10 hex
digits) names the run's Kubernetes objects and its directories under a location the user passed, so runs that
share a `checkpoint_dir`, a claim or a `status_uri` never see each other's state. Outside a pipeline the launcher
gives its workers one generated id (`new_run_id`); `--run-id` lets a later launch resume a run that was stopped.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid

from trainer.core.errors import UsageError

CONFIGMAP = "configmap:"
_KEY = re.compile(r"^r[0-9a-f]{10}$")


def run_key(run_id: str) -> str:
    """A short DNS-safe key for a run: `r` + 10 hex digits of its SHA-1 (unique per run, stable across retries)."""
    if not run_id:
        raise UsageError("run id is empty; the pipeline passes dsl.PIPELINE_JOB_ID_PLACEHOLDER")
    return "r" + hashlib.sha1(run_id.encode()).hexdigest()[:10]


def is_run_key(name: str) -> bool:
    """Whether `name` is a run key (a run's directory under a shared location)."""
    return bool(_KEY.match(name))


def new_run_id() -> str:
    """A fresh id for a run started outside a pipeline: `local-<UTC time>-<random>`."""
    return f"local-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def run_status_uri(uri: str, run_id: str) -> str:
    """The run's own status location under a `status_uri` the user passed.

    `configmap:NAME` becomes `configmap:NAME-<run key>`; a path or object `DIR/NAME` becomes `DIR/<run key>/NAME`.
    """
    key = run_key(run_id)
    if uri.startswith(CONFIGMAP):
        return f"{uri}-{key}"
    head, sep, name = uri.rstrip("/").rpartition("/")
    return f"{head}{sep}{key}/{name}"


def run_log_dir(tensorboard_dir: str, run_id: str) -> str:
    """Where one run's event files go: `tensorboard_dir/<run_id>` (or `tensorboard_dir` itself without a run id).

    Each run is one TensorBoard "run" with a `train` and, when validating, a `validation` subdirectory, so
    TensorBoard draws both on one chart and every retrain appears beside the earlier ones.
    """
    root = tensorboard_dir.rstrip("/")
    return f"{root}/{run_id}" if run_id else root
