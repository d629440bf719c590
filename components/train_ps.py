"""Parameter-server mode: `train_chief` coordinates and exports the model; `train_server` runs one ps or worker."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


def train_chief(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    model: Output[Model],
    status_uri: str,
    epochs: int = 12,
    batch_size: int = 64,
    learning_rate: float = 0.002,
    startup_timeout: float = 600.0,
    cluster_mode: str = "kubernetes",
    run_id: str = "",
):
    """Coordinates ParameterServerStrategy training and writes the model; publishes the job's status for the servers.

    Args:
        dataset: the prepared dataset from prepare_data.
        cluster: the run's cluster.json (chief, worker and ps addresses) from create_cluster.
        model: saved_model/ (serving signature on raw uint8 images), model.keras and history.json.
        status_uri: a tf.io.gfile path every ps and worker can read (a bucket path on a cluster); the chief writes its
            state and heartbeat there, and the servers exit when it says the job is over.
        epochs: passes over the training data.
        batch_size: examples per step; each step runs on one worker.
        learning_rate: Adam learning rate.
        startup_timeout: seconds to wait for the parameter servers before failing with their names.
        cluster_mode: 'kubernetes' labels this pod for its Service and waits for the peers' names; 'local' does not.
        run_id: the pipeline run's id, as given to create_cluster.
    """
    import json
    import os
    import sys

    from trainer import k8s, train
    from trainer.cli import run_cli
    from trainer.cluster import build_tf_config

    with open(os.path.join(cluster.path, "cluster.json")) as f:
        spec = json.load(f)
    if cluster_mode == "kubernetes":
        code = run_cli(lambda: k8s.join_cluster(spec, "chief", 0, run_id, startup_timeout))
        if code:
            sys.exit(code)
    code = train.main(["--data", dataset.path, "--model-dir", model.path, "--strategy", "parameter_server", "--status-uri", status_uri,
                       "--tf-config", json.dumps(build_tf_config(spec, "chief", 0)), "--epochs", str(epochs),
                       "--batch-size", str(batch_size), "--learning-rate", str(learning_rate), "--startup-timeout", str(startup_timeout)])
    if code:
        sys.exit(code)
    model.metadata.update({"chief": True, "strategy": "parameter_server"})


def train_server(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    task: str,
    status_uri: str,
    startup_timeout: float = 600.0,
    chief_timeout: float = 120.0,
    cluster_mode: str = "kubernetes",
    run_id: str = "",
):
    """Runs one parameter server or worker until the chief's status says the job is over.

    Args:
        dataset: the prepared dataset (workers read their share of it).
        cluster: the run's cluster.json from create_cluster.
        task: this op's task, such as 'ps:0' or 'worker:1'.
        status_uri: the chief's status document; succeeded -> exit 0, failed -> exit 1, stale heartbeat -> exit 138.
        startup_timeout: seconds to wait for the chief's first status.
        chief_timeout: a heartbeat older than this means the chief vanished.
        cluster_mode: 'kubernetes' labels this pod for its Service and waits for the peers' names; 'local' does not.
        run_id: the pipeline run's id, as given to create_cluster.
    """
    import json
    import os
    import sys
    import tempfile

    from trainer import k8s, train
    from trainer.cli import run_cli
    from trainer.cluster import build_tf_config

    job, _, index = task.partition(":")
    with open(os.path.join(cluster.path, "cluster.json")) as f:
        spec = json.load(f)
    if cluster_mode == "kubernetes":
        code = run_cli(lambda: k8s.join_cluster(spec, job, int(index), run_id, startup_timeout))
        if code:
            sys.exit(code)
    sys.exit(train.main(["--data", dataset.path, "--model-dir", tempfile.mkdtemp(), "--strategy", "parameter_server",
                         "--status-uri", status_uri, "--tf-config", json.dumps(build_tf_config(spec, job, int(index))),
                         "--startup-timeout", str(startup_timeout), "--chief-timeout", str(chief_timeout)]))
