"""The `publish_model` step: runs only behind the quality gate; copies the chief's SavedModel to a versioned path."""

from kfp.dsl import Input, Markdown, Metrics, Model, Output


def publish_model(
    model: Input[Model],
    metrics: Input[Metrics],
    decision: Output[Markdown],
    publish_uri: str,
    storage: str,
    s3_endpoint: str,
    gate: str,
):
    """Publishes the model under publish_uri/<version>/ unless the model already published there is better.

    Lineage (run, dataset, training parameters) comes from the model's own history.json; the gate's metric and
    direction say which model is better.

    Args:
        model: the chief's model as the evaluate step passed it on.
        metrics: the evaluate step's metrics (accuracy and loss, or the metrics a model_fn's model was compiled with).
        decision: what was decided and why (published version, or the better model already there), and the version
            latest.json names now (latest_version, latest_path): the one a deployment serves.
    """
    import os

    from trainer import steps
    from trainer.core.entry import run_step

    result = run_step(
        steps.publish_model,
        model_dir=model.path,
        metrics=dict(metrics.metadata),
        publish_uri=publish_uri,
        model_uri=model.metadata.get("source_uri", model.uri),
        s3_endpoint=s3_endpoint,
        storage=storage,
        gate=gate,
    )
    os.makedirs(os.path.dirname(decision.path), exist_ok=True)
    with open(decision.path, "w") as f:
        f.write(f"# Publish\n\n{result.reason}.\n\nPublish location: `{publish_uri}`\n")
    latest_version, latest_path = result.latest
    decision.metadata.update(
        {
            "published": result.published,
            "version": result.version or 0,
            "latest_version": latest_version,
            "latest_path": latest_path,
        }
    )
