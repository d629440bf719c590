"""The `delete_cluster` step: the exit handler that removes the run's Services, whether the run passed or failed."""


def delete_cluster(run_id: str, cluster_mode: str = "kubernetes"):
    """Deletes every Service labelled with this run; deleting twice, or nothing, is fine.

    Args:
        run_id: the pipeline run's id, as given to create_cluster.
        cluster_mode: 'kubernetes' deletes the run's Services; 'local' has nothing to delete.
    """
    import os
    import sys

    from trainer import k8s
    from trainer.cli import setup_logging
    from trainer.errors import KubernetesError

    setup_logging()
    if cluster_mode != "kubernetes":
        return
    try:
        k8s.delete_services(k8s.core_api(), os.environ.get("POD_NAMESPACE", ""), run_id)
    except KubernetesError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
