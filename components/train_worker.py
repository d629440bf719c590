"""The `train_worker` step: one MultiWorkerMirroredStrategy worker; the chief's Model artifact holds the model."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


def train_worker(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    worker_index: int,
    model: Output[Model],
    run_id: str,
    model_fn: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    startup_timeout: float,
    unschedulable_timeout: float,
    collective_timeout: float,
    max_restarts: int,
    checkpoint_dir: str,
    checkpoint_claim: str,
    tensorboard_dir: str,
    cluster_mode: str,
    gate: str = "",
    mixed_precision: str = "",
):
    """Trains as one worker of the run's cluster; worker 0 (the chief) writes the model.

    In kubernetes mode the worker first creates its Service, labels its own pod so that the Service selects it and
    waits until every name of the cluster resolves; it deletes its Service when the step ends. Training runs in a
    supervised child process that restarts in place after a lost peer.

    Args:
        dataset: the prepared dataset from prepare_data.
        cluster: the run's cluster.json from create_cluster; TF_CONFIG is built from it and worker_index.
        worker_index: this worker's index in the cluster (0 is the chief).
        model: on the chief, saved_model/ (serving signature on raw uint8 images, or a model_fn's own inputs and
            outputs), model.keras and history.json;
            on the other workers, only worker.json saying which worker this was. The chief also writes TensorBoard
            event files under tensorboard_dir when it is set.
    """
    from trainer import steps
    from trainer.core.entry import run_step

    model.metadata.update(
        run_step(
            steps.train_task,
            dataset=dataset.path,
            cluster_dir=cluster.path,
            job="worker",
            index=worker_index,
            model_dir=model.path,
            run_id=run_id,
            model_fn=model_fn,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            startup_timeout=startup_timeout,
            unschedulable_timeout=unschedulable_timeout,
            collective_timeout=collective_timeout,
            max_restarts=max_restarts,
            checkpoint_dir=checkpoint_dir,
            gate=gate,
            mixed_precision=mixed_precision,
            checkpoint_claim=checkpoint_claim,
            tensorboard_dir=tensorboard_dir,
            cluster_mode=cluster_mode,
        )
    )
