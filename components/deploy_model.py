"""The `deploy_model` step: behind the gate, serves the published model with a KServe InferenceService."""

from kfp.dsl import Input, Markdown, Output


def deploy_model(
    decision: Input[Markdown],
    deployment: Output[Markdown],
    publish_uri: str,
    serving_name: str,
    serving_timeout: float,
    serving_runtime_version: str,
    storage: str,
    s3_endpoint: str,
) -> str:
    """Creates or patches the InferenceService `serving_name` on the publish location and waits until it is Ready.

    It serves the version that latest.json names after the publish step (the best published so far). When the new
    revision fails, the previous one keeps serving and this step fails with KServe's reason.

    Args:
        decision: the publish step's decision, with the latest published version and its path.
        deployment: the InferenceService, its URL and TF Serving's predict endpoint behind it.

    Returns:
        The InferenceService's URL (empty when serving_name is empty).
    """
    import os

    from trainer import steps
    from trainer.core.entry import run_step

    result = run_step(
        steps.deploy_model,
        publish_uri=publish_uri,
        serving_name=serving_name,
        serving_timeout=serving_timeout,
        serving_runtime_version=serving_runtime_version,
        version=int(decision.metadata.get("latest_version") or 0),
        published_path=decision.metadata.get("latest_path", ""),
        storage=storage,
        s3_endpoint=s3_endpoint,
    )
    lines = [f"# Deploy\n\n{result.reason}."]
    if result.deployed:
        lines.append(f'Predict: `POST {result.predict_url}` with `{{"instances": [...]}}` (raw uint8 images).')
        deployment.metadata.update(result.output_metadata())
    os.makedirs(os.path.dirname(deployment.path), exist_ok=True)
    with open(deployment.path, "w") as f:
        f.write("\n\n".join(lines) + "\n")
    return result.url
