"""The `evaluate` step: the chief's SavedModel on the held-out split -> metrics the Kubeflow UI draws + a report."""

from kfp.dsl import HTML, ClassificationMetrics, Dataset, Input, Metrics, Model, Output


def evaluate(
    dataset: Input[Dataset],
    models: Input[list[Model]],
    metrics: Output[Metrics],
    classification_metrics: Output[ClassificationMetrics],
    report: Output[HTML],
    chief_model: Output[Model],
    min_accuracy: float = 0.0,
) -> float:
    """Evaluates the chief's exported SavedModel (not the Python model code) on the test split.

    Args:
        dataset: the prepared dataset from prepare_data.
        models: the Model artifacts of all workers; exactly one (the chief's) holds a SavedModel.
        metrics: test accuracy, loss and example count.
        classification_metrics: the confusion matrix, drawn by the Kubeflow UI.
        report: an HTML page with the training curves, per-class precision/recall/F1 and the confusion matrix.
        chief_model: a copy of the chief's model (saved_model/, model.keras, history.json), for publishing.
        min_accuracy: the quality gate; the metrics record whether the model passed it (1) or not (0).

    Returns:
        The test accuracy.
    """
    import json
    import os
    import shutil

    from trainer import evaluate as evaluation
    from trainer.report import write_html

    chiefs = [m for m in models if os.path.isdir(os.path.join(m.path, "saved_model"))]
    if len(chiefs) != 1:
        raise SystemExit(f"error: expected exactly one worker model with a SavedModel, found {len(chiefs)} of {len(models)}")
    chief = chiefs[0]
    result = evaluation.run(chief.path, dataset.path)
    with open(os.path.join(chief.path, "history.json")) as f:
        history = json.load(f)
    metrics.log_metric("accuracy", result["accuracy"])
    metrics.log_metric("loss", result["loss"])
    metrics.log_metric("test_examples", result["num_examples"])
    metrics.log_metric("min_accuracy", min_accuracy)
    metrics.log_metric("passed_gate", int(result["accuracy"] >= min_accuracy))
    result["min_accuracy"] = min_accuracy
    classification_metrics.log_confusion_matrix(result["class_names"], result["confusion_matrix"])
    os.makedirs(os.path.dirname(report.path), exist_ok=True)
    write_html(report.path, result, history)
    report.metadata["model_uri"] = chief.uri
    shutil.copytree(chief.path, chief_model.path)
    chief_model.metadata.update({"accuracy": result["accuracy"], "source_uri": chief.uri})
    return result["accuracy"]
