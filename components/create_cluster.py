"""The cluster steps: give every training task of the run an address (one variant per strategy)."""

from kfp.dsl import Artifact, Output


def create_cluster(cluster: Output[Artifact], run_id: str, num_workers: int, cluster_mode: str, port: int) -> list[int]:
    """Gives each MultiWorkerMirroredStrategy worker of the run an address every other worker can reach.

    Args:
        cluster: cluster.json: the cluster spec every worker turns into its TF_CONFIG, and its supervisors' addresses.

    Returns:
        The worker indices [0, 1, ..., num_workers - 1]: the items of the training ParallelFor.
    """
    from trainer import steps
    from trainer.core.entry import run_step

    record = run_step(
        steps.create_cluster,
        output_dir=cluster.path,
        run_id=run_id,
        num_workers=num_workers,
        cluster_mode=cluster_mode,
        port=port,
    )
    cluster.metadata.update(record.to_json())
    return list(range(num_workers))


def create_ps_cluster(
    cluster: Output[Artifact], run_id: str, num_workers: int, num_ps: int, cluster_mode: str, port: int
) -> list[str]:
    """Gives the chief, each parameter server and each worker of the run an address.

    Args:
        cluster: cluster.json with the chief, worker and ps addresses.

    Returns:
        The server tasks ['worker:0', ..., 'ps:0', ...]: the items of the ParallelFor beside the chief.
    """
    from trainer import steps
    from trainer.core.entry import run_step
    from trainer.core.tasks import TaskId

    record = run_step(
        steps.create_cluster,
        output_dir=cluster.path,
        run_id=run_id,
        num_workers=num_workers,
        cluster_mode=cluster_mode,
        port=port,
        num_ps=num_ps,
    )
    cluster.metadata.update(record.to_json())
    return [TaskId("worker", i).label for i in range(num_workers)] + [TaskId("ps", i).label for i in range(num_ps)]
