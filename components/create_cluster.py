"""The `create_cluster` step: the run's worker addresses and the list of indices the workers fan out over."""

from kfp.dsl import Artifact, Output


def create_cluster(
    num_workers: int,
    cluster: Output[Artifact],
    run_id: str = "",
    cluster_mode: str = "kubernetes",
    port: int = 2222,
    num_ps: int = 0,
) -> list:
    """Generates the cluster spec that every training worker turns into its TF_CONFIG.

    Args:
        num_workers: how many training workers to run (each becomes one ParallelFor iteration).
        cluster: cluster.json, such as {"worker": ["host0:2222", "host1:2222"]}; its metadata lists the addresses.
        run_id: the pipeline run's id; Service names are derived from it.
        cluster_mode: 'kubernetes' creates one headless Service per worker in this pod's namespace (names stable
            for the run); 'local' picks free loopback ports (kfp.local runs).
        port: the TF gRPC port each worker listens on in kubernetes mode.
        num_ps: parameter servers; above 0 the cluster is one chief, num_workers workers and num_ps parameter servers.

    Returns:
        The items of the ParallelFor: worker indices [0, 1, ..., num_workers - 1]; with parameter servers, the
        server tasks ["worker:0", ..., "ps:0", ...] (the chief runs in its own op).
    """
    import json
    import os
    import sys

    from trainer import k8s
    from trainer.cli import setup_logging
    from trainer.cluster import assign_addresses
    from trainer.errors import KubernetesError, UsageError
    from trainer.launch import local_cluster

    setup_logging()
    try:
        if num_ps < 0:
            raise UsageError(f"num_ps {num_ps} is not allowed; allowed: 0 (mirrored) or more")
        tasks = num_workers + (num_ps + 1 if num_ps else 0)
        if cluster_mode == "local":
            addresses = local_cluster(tasks)
        elif cluster_mode == "kubernetes":
            namespace = os.environ.get("POD_NAMESPACE", "")
            k8s.check_workers(tasks)
            addresses = k8s.create_services(k8s.core_api(), namespace, run_id, tasks, port)
        else:
            raise UsageError(f"cluster_mode {cluster_mode!r} is not allowed; allowed: kubernetes, local")
    except (UsageError, KubernetesError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if isinstance(err, UsageError) else 1)
    spec = assign_addresses(addresses, num_workers, num_ps)
    if num_ps:
        items = [f"worker:{i}" for i in range(num_workers)] + [f"ps:{i}" for i in range(num_ps)]
    else:
        items = list(range(num_workers))
    os.makedirs(cluster.path, exist_ok=True)
    with open(os.path.join(cluster.path, "cluster.json"), "w") as f:
        json.dump(spec, f)
    cluster.metadata.update({"cluster": spec, "mode": cluster_mode})
    return items
