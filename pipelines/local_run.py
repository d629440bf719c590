"""Running the whole pipeline here with kfp.local: every step a subprocess, artifacts under a local pipeline root."""

import os
import time
from typing import Any

from pipelines.factories import mirrored_pipeline
from trainer.config import settings
from trainer.config.checks import Check, is_int, require
from trainer.config.contract import ModelConfig
from trainer.config.gate import Gate
from trainer.evaluation.verdict import BOOKKEEPING
from trainer.modeling import kinds
from trainer.publishing.publish import ACCURACY, latest
from trainer.records.history import History

LOCAL_MAX_WORKERS = 2
LOCAL_IMAGE = "kfp-tf-multiworker:local"
LOCAL_OVERRIDES = {"cluster_mode": "local", "startup_timeout": settings.default("startup_timeout"), "source": "sample"}


LOCAL_WORKERS = Check(
    lambda v: is_int(v) and 1 <= v <= LOCAL_MAX_WORKERS,
    f"1 to {LOCAL_MAX_WORKERS} with --local. kfp.local runs at most 2 ParallelFor iterations at once and every "
    "MultiWorkerMirroredStrategy worker must run at the same time, so more workers would wait for each other forever; "
    "use trainer-launch or a cluster",
)


def check_workers(num_workers: int) -> None:
    """Refuses worker counts that kfp.local cannot run at once (it runs at most 2 loop iterations concurrently)."""
    require("--num-workers", num_workers, LOCAL_WORKERS)


def check_combination(arguments: dict[str, Any]) -> None:
    """Refuses, before anything runs, settings that are each allowed but would fail the run together.

    The model's kind (`trainer.modeling.kinds.choose`) judges them as the training task would.

    Raises:
        UsageError: data from a function without model_fn, or a gate on a metric the built-in CNN does not report.
    """
    kind = kinds.choose(ModelConfig(model_fn=arguments.get("model_fn", "")))
    kind.check_settings(source=arguments.get("source", ""), gate=arguments.get("gate", ""))


def run_local(output_dir: str, **arguments: Any) -> dict[str, Any]:
    """Runs the mirrored pipeline through kfp.local's SubprocessRunner and returns what the run produced.

    Args:
        output_dir: the local pipeline root.
        **arguments: pipeline parameters; `cluster_mode` is local and `source` the shipped sample unless given.

    Returns:
        accuracy (-1.0: the model reports none), the test metrics, the serving check's result, the paths of the
        model and the report, the run's directory, the seconds it took, what happened at the publish location,
        and where the TensorBoard event files are.
    """
    from kfp import local

    arguments = {**LOCAL_OVERRIDES, **arguments}
    for name, value in arguments.items():
        settings.check(name, value)
    check_workers(arguments.get("num_workers", settings.default("num_workers")))
    check_combination(arguments)
    for location in ("publish_uri", "tensorboard_dir"):
        if arguments.get(location) and "://" not in arguments[location]:
            arguments[location] = os.path.abspath(arguments[location])
    root = os.path.abspath(output_dir)
    os.makedirs(root, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    started = time.monotonic()
    outputs = mirrored_pipeline(LOCAL_IMAGE)(**arguments).outputs
    model = outputs["model"].path
    history = History.read(model)
    metrics = outputs["metrics"].metadata
    result = {
        "seconds": round(time.monotonic() - started, 1),
        "accuracy": outputs["accuracy"],
        "test metrics": ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k not in BOOKKEEPING),
        "serving check": outputs["report"].metadata["serving_check"],
        "model": model,
        "report": outputs["report"].path,
        "run": os.path.dirname(os.path.dirname(model)),
        "tensorboard": history.tensorboard or "none (no --tensorboard-dir)",
    }
    publish_uri = arguments.get("publish_uri", "")
    decision = outputs["report"].metadata["decision"]
    gate = Gate.of(arguments.get("gate", ""), arguments.get("min_accuracy", settings.default("min_accuracy")))
    result["publish"] = publish_summary(history.run_id, decision, metrics, publish_uri, gate)
    return result


def publish_summary(
    run_id: str, decision: str, metrics: dict[str, Any], publish_uri: str, gate: Gate = ACCURACY
) -> str:
    """What the run did at the publish location: evaluate's decision, then the location itself (latest.json)."""
    if not publish_uri:
        return "not published: no publish location"
    if decision != "publish":
        return "not published: " + decision.removeprefix("hold: ")
    published = latest(publish_uri)
    if published is not None and published.lineage["run_id"] == run_id:
        return f"published version {published.version} at {published.path}"
    name = gate.metric
    known = f"{published.version} ({published.value(name) or 0:.4f})" if published else "(none)"
    side = "below" if gate.higher_is_better else "above"
    return f"not published: {name} {metrics[name]:.4f} is {side} the published version {known}"
