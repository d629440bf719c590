"""The `evaluate` step: the chief's SavedModel on the held-out split -> metrics the Kubeflow UI draws + a report."""

from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output


def evaluate(
    dataset: Input[Dataset],
    models: Input[list[Model]],
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[HTML],
    chief_model: Output[Model],
    min_accuracy: float,
) -> float:
    """Evaluates the chief's exported SavedModel (not the Python model code) on the test split.

    Args:
        dataset: the prepared dataset from prepare_data.
        models: the Model artifacts of all workers; exactly one (the chief's) holds a SavedModel.
        metrics: test accuracy, loss, example count, and whether the model passed the quality gate.
        classification_metrics: the confusion matrix, drawn by the Kubeflow UI.
        report: an HTML page with the training curves, per-class precision/recall/F1 and the confusion matrix.
        chief_model: a copy of the chief's model (saved_model/, model.keras, history.json), for publishing.

    Returns:
        The test accuracy.
    """
    from trainer import steps
    from trainer.cli import run_step

    result = run_step(
        steps.evaluate,
        dataset=dataset.path,
        model_dirs=[m.path for m in models],
        report=report.path,
        chief_copy=chief_model.path,
        min_accuracy=min_accuracy,
    )
    for name in ("accuracy", "loss", "min_accuracy", "passed_gate"):
        metrics.log_metric(name, result[name])
    metrics.log_metric("test_examples", result["num_examples"])
    classification_metrics.log_confusion_matrix(result["class_names"], result["confusion_matrix"])
    source = next(m for m in models if m.path == result["source_dir"])
    report.metadata["model_uri"] = source.uri
    chief_model.metadata.update({"accuracy": result["accuracy"], "source_uri": source.uri})
    return result["accuracy"]
