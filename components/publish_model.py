"""The `publish_model` step: runs only behind the quality gate; copies the chief's SavedModel to a versioned path."""

from kfp.dsl import Input, Markdown, Metrics, Model, Output


def publish_model(
    model: Input[Model],
    metrics: Input[Metrics],
    publish_uri: str,
    decision: Output[Markdown],
    run_id: str = "",
    source: str = "",
    num_workers: int = 0,
    epochs: int = 0,
    batch_size: int = 0,
    learning_rate: float = 0.0,
):
    """Publishes the model under publish_uri/<version>/ unless the model already published there is better.

    Args:
        model: the chief's model as the evaluate step passed it on.
        metrics: the evaluate step's metrics (accuracy, loss).
        publish_uri: a local path or tf.io.gfile URI; versions go in integer subdirectories, with latest.json.
        decision: what was decided and why (published version, or the better model already there).
        run_id: lineage: the pipeline run's id.
        source: lineage: the data source.
        num_workers: lineage: training workers.
        epochs: lineage: epochs.
        batch_size: lineage: per-worker batch size.
        learning_rate: lineage: learning rate.
    """
    import os

    from trainer.publish import publish

    lineage = {"run_id": run_id, "dataset": source, "model_uri": model.metadata.get("source_uri", model.uri),
               "parameters": {"num_workers": num_workers, "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate}}
    result = publish(os.path.join(model.path, "saved_model"), dict(metrics.metadata), publish_uri, lineage)
    os.makedirs(os.path.dirname(decision.path), exist_ok=True)
    with open(decision.path, "w") as f:
        f.write(f"# Publish\n\n{result['reason']}.\n\nPublish location: `{publish_uri}`\n")
    decision.metadata.update({"published": result["published"], "version": result["version"] or 0})
