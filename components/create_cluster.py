"""The `create_cluster` step: the run's worker addresses and the list of indices the workers fan out over."""

from kfp.dsl import Artifact, Output


def create_cluster(
    num_workers: int,
    cluster: Output[Artifact],
    cluster_mode: str = "kubernetes",
    port: int = 2222,
) -> list[int]:
    """Generates the cluster spec that every training worker turns into its TF_CONFIG.

    Args:
        num_workers: how many training workers to run (each becomes one ParallelFor iteration).
        cluster: cluster.json, such as {"worker": ["host0:2222", "host1:2222"]}; its metadata lists the addresses.
        cluster_mode: 'local' picks free loopback ports (kfp.local runs); 'kubernetes' names one headless Service
            per worker, stable for the run.
        port: the TF gRPC port each worker listens on in kubernetes mode.

    Returns:
        The worker indices [0, 1, ..., num_workers - 1]: the items of the workers' ParallelFor.
    """
    import json
    import os
    import sys

    from trainer.errors import UsageError
    from trainer.launch import local_cluster

    try:
        if cluster_mode == "local":
            addresses = local_cluster(num_workers)
        else:
            raise UsageError(f"cluster_mode {cluster_mode!r} is not allowed; allowed: local")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    os.makedirs(cluster.path, exist_ok=True)
    with open(os.path.join(cluster.path, "cluster.json"), "w") as f:
        json.dump({"worker": addresses}, f)
    cluster.metadata.update({"workers": addresses, "mode": cluster_mode})
    return list(range(num_workers))
