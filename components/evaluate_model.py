"""The `evaluate` step: the chief's SavedModel on the held-out split, then served in a fresh process and queried."""

from typing import NamedTuple

from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output


def evaluate(
    dataset: Input[Dataset],
    models: Input[list[Model]],
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[HTML],
    chief_model: Output[Model],
    min_accuracy: float,
    gate: str,
) -> NamedTuple("Outputs", [("Output", str), ("accuracy", float), ("serving_check", str)]):
    """Evaluates the chief's model on the held-out split and runs the serving check on its SavedModel.

    The built-in CNN's exported SavedModel (not the Python model code) gets accuracy, loss and per-class results; a
    model_fn's model reports the metrics it was compiled with. The serving check loads the SavedModel the way
    TensorFlow Serving does, in a fresh process, sends held-out examples as a TF Serving REST request and checks the
    answer against the evaluation; publishing needs it passed.

    Args:
        dataset: the prepared dataset from prepare_data.
        models: the Model artifacts of all workers; exactly one (the chief's) holds a SavedModel.
        metrics: the test metrics (accuracy and loss, or a model_fn's compiled metrics), example count, the gate's
            threshold, whether the model passed the quality gate and the serving check.
        classification_metrics: the confusion matrix, drawn by the Kubeflow UI (the built-in CNN only).
        report: an HTML page with the gate and serving check results, the training curves, a link to the TensorBoard
            event files, per-class precision/recall/F1 and the confusion matrix.
        chief_model: a copy of the chief's model (saved_model/, model.keras, history.json), for publishing.

    Returns:
        Output: the publish decision: "publish" when the model passed the gate and the serving check, else "hold: "
            and why not.
        accuracy: the test accuracy; -1.0 when a model_fn's model was compiled without an accuracy metric (or its
            accuracy is not a number).
        serving_check: "passed", or "failed: " and which check failed and why.
    """
    from collections import namedtuple

    from trainer import steps
    from trainer.core.entry import run_step

    verdict = run_step(
        steps.evaluate,
        dataset=dataset.path,
        model_dirs=[m.path for m in models],
        report=report.path,
        chief_copy=chief_model.path,
        min_accuracy=min_accuracy,
        gate=gate,
    )
    for name, value in verdict.metrics().items():
        metrics.log_metric(name, value)
    results, check = verdict.evaluation, verdict.serving_check
    if results.confusion() is not None:
        classification_metrics.log_confusion_matrix(*results.confusion())
    own = {name: value for name, value in verdict.metrics().items() if name in results.scalars()}
    accuracy = float(own.get("accuracy", -1.0))
    source = next(m for m in models if m.path == verdict.model_dir)
    report.metadata.update({"model_uri": source.uri, "serving_check": check.summary, "decision": verdict.decision})
    chief_model.metadata.update(
        {**own, "source_uri": source.uri, "serving_check": check.summary, "gate": str(verdict.gate)}
    )
    outputs = namedtuple("Outputs", ["Output", "accuracy", "serving_check"])
    return outputs(verdict.decision, accuracy, "passed" if check.passed else f"failed: {check.reason}")
