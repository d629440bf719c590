"""The `train_worker` step: one MultiWorkerMirroredStrategy worker; the chief's Model artifact holds the model."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


def train_worker(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    worker_index: int,
    model: Output[Model],
    epochs: int = 12,
    batch_size: int = 64,
    learning_rate: float = 0.002,
    startup_timeout: float = 600.0,
    collective_timeout: float = 0.0,
    checkpoint_dir: str = "",
    cluster_mode: str = "kubernetes",
    run_id: str = "",
):
    """Trains as one worker of the run's cluster; worker 0 (the chief) writes the model.

    Args:
        dataset: the prepared dataset from prepare_data.
        cluster: the run's cluster.json from create_cluster; TF_CONFIG is built from it and worker_index.
        worker_index: this worker's index in the cluster (0 is the chief).
        model: on the chief, saved_model/ (serving signature on raw uint8 images), model.keras and history.json;
            on the other workers, only worker.json saying which worker this was.
        epochs: passes over the training data.
        batch_size: examples per worker per step; the global batch is this times the number of workers.
        learning_rate: peak Adam learning rate for one worker, scaled by sqrt(workers), cosine-decayed over the run.
        startup_timeout: seconds to wait for every peer to join before failing with the missing peers' names.
        collective_timeout: seconds before one collective op fails; 0 (default) for none: a lost peer is detected
            by heartbeats anyway, and TF 2.21 leaks a thread per collective op when a timeout is set.
        checkpoint_dir: BackupAndRestore directory shared by all workers (a tf.io.gfile URI such as gs://... or a
            shared volume) so a retried worker resumes; empty keeps checkpoints in the pod, lost on retry.
        cluster_mode: 'kubernetes' labels this pod so its Service selects it and waits for the peers' names to
            resolve; 'local' does neither.
        run_id: the pipeline run's id, as given to create_cluster.
    """
    import json
    import os
    import sys

    from trainer import k8s, train
    from trainer.cli import run_cli

    with open(os.path.join(cluster.path, "cluster.json")) as f:
        cluster_spec = f.read()
    if cluster_mode == "kubernetes":
        code = run_cli(lambda: k8s.join_cluster(json.loads(cluster_spec), "worker", worker_index, run_id, startup_timeout))
        if code:
            sys.exit(code)
    args = [
        "--data", dataset.path, "--model-dir", model.path, "--cluster-spec", cluster_spec,
        "--worker-index", str(worker_index), "--epochs", str(epochs), "--batch-size", str(batch_size),
        "--learning-rate", str(learning_rate), "--startup-timeout", str(startup_timeout),
        "--collective-timeout", str(collective_timeout),
    ]
    if checkpoint_dir:
        args += ["--checkpoint-dir", checkpoint_dir]
    code = train.main(args)
    if code:
        sys.exit(code)
    chief = os.path.isdir(os.path.join(model.path, "saved_model"))
    if not chief:
        os.makedirs(model.path, exist_ok=True)
        with open(os.path.join(model.path, "worker.json"), "w") as f:
            json.dump({"worker_index": worker_index, "chief": False}, f)
    model.metadata.update({"worker_index": worker_index, "chief": chief, "framework": "tensorflow"})
