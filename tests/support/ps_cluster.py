"""Parameter-server clusters for tests: in this process (TensorFlow's `create_in_process_cluster` pattern), or chief,
ps and workers as processes with one of them killed mid-run."""

import json
import sys
import time

from tests.support.processes import Streamed, child_env, trainer_args
from trainer.cluster.local_processes import free_ports
from trainer.cluster.topology import build_tf_config, make_cluster


def kill_one(sample_data, tmp_path, status_uri, env, victim=("chief", 0)):
    """Starts a chief, ps 0 and workers 0 and 1 on free ports, kills `victim` after the chief's epoch 2.

    Returns:
        (processes by (job, index), exit codes of all but the victim, seconds from the kill to the last exit).
    """
    ports = free_ports(4)
    spec = make_cluster(
        [f"localhost:{ports[1]}", f"localhost:{ports[2]}"], chief=f"localhost:{ports[0]}", ps=[f"localhost:{ports[3]}"]
    )
    args = trainer_args(sample_data, tmp_path / "model", "--epochs", "30", "--strategy", "parameter_server")
    args += ["--status-uri", status_uri, "--chief-timeout", "8", "--run-id", "ps-1"]
    procs = {
        (job, i): Streamed(
            [sys.executable, "-m", "trainer.train", *args],
            child_env({**env, "TF_CONFIG": json.dumps(build_tf_config(spec, job, i))}),
        )
        for job, i in (("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1))
    }
    try:
        procs[("chief", 0)].wait_for(r"epoch 2:", 180)
        procs[victim].proc.kill()
        killed_at = time.monotonic()
        codes = {key: p.finish(60) for key, p in procs.items() if key != victim}
        elapsed = time.monotonic() - killed_at
    finally:
        for p in procs.values():
            p.kill()
    return procs, codes, elapsed


def in_process_cluster(num_workers: int, num_ps: int) -> dict[str, list[str]]:
    """Starts `num_workers` worker and `num_ps` ps servers in this process; returns the cluster with a chief's address.

    As TensorFlow's own tests do (`multi_worker_test_base.create_in_process_cluster`): standard `tf.distribute.Server`s
    on free loopback ports, a worker given more inter-op threads than there are workers (fewer can hang the cluster).
    The chief's address is left free: the coordinator, in this process too, serves there once its strategy connects.
    An in-process server cannot be stopped, so its threads stay until the process ends (one cluster per test process).
    """
    import tensorflow as tf

    ports = [f"localhost:{p}" for p in free_ports(1 + num_workers + num_ps)]
    cluster = {"chief": ports[:1], "worker": ports[1 : 1 + num_workers], "ps": ports[1 + num_workers :]}
    worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=num_workers + 1)
    for job, config in (("worker", worker_config), ("ps", tf.compat.v1.ConfigProto())):
        for index in range(len(cluster[job])):
            tf.distribute.Server(
                tf.train.ClusterSpec(cluster),
                job_name=job,
                task_index=index,
                config=config,
                protocol="grpc",
                start=True,
            )
    return cluster
