"""Parameter-server mode: `train_chief` coordinates and exports the model; `train_server` runs one ps or worker."""

from kfp.dsl import Artifact, Dataset, Input, Model, Output


def train_chief(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    model: Output[Model],
    run_id: str,
    status_uri: str,
    storage: str,
    s3_endpoint: str,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    startup_timeout: float,
    unschedulable_timeout: float,
    tensorboard_dir: str,
    cluster_mode: str,
):
    """Coordinates ParameterServerStrategy training and writes the model; publishes the job's status for the servers.

    Args:
        dataset: the prepared dataset from prepare_data.
        cluster: the run's cluster.json (chief, worker and ps addresses) from create_ps_cluster.
        model: saved_model/ (serving signature on raw uint8 images), model.keras and history.json.
    """
    from trainer import steps
    from trainer.core.entry import run_step

    model.metadata.update(
        run_step(
            steps.train_task,
            dataset=dataset.path,
            cluster_dir=cluster.path,
            job="chief",
            index=0,
            model_dir=model.path,
            run_id=run_id,
            strategy="parameter_server",
            status_uri=status_uri,
            storage=storage,
            s3_endpoint=s3_endpoint,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            startup_timeout=startup_timeout,
            unschedulable_timeout=unschedulable_timeout,
            tensorboard_dir=tensorboard_dir,
            cluster_mode=cluster_mode,
        )
    )


def train_server(
    dataset: Input[Dataset],
    cluster: Input[Artifact],
    task: str,
    run_id: str,
    status_uri: str,
    storage: str,
    s3_endpoint: str,
    startup_timeout: float,
    unschedulable_timeout: float,
    chief_timeout: float,
    cluster_mode: str,
):
    """Runs one parameter server or worker until the chief's status says the job is over.

    Args:
        dataset: the prepared dataset (workers read their share of it).
        cluster: the run's cluster.json from create_ps_cluster.
        task: this op's task, such as 'ps:0' or 'worker:1'.
    """
    import tempfile

    from trainer import steps
    from trainer.core.entry import run_step
    from trainer.core.tasks import TaskId

    server = run_step(TaskId.parse, label=task)
    run_step(
        steps.train_task,
        dataset=dataset.path,
        cluster_dir=cluster.path,
        job=server.type,
        index=server.index,
        model_dir=tempfile.mkdtemp(),
        run_id=run_id,
        strategy="parameter_server",
        status_uri=status_uri,
        storage=storage,
        s3_endpoint=s3_endpoint,
        startup_timeout=startup_timeout,
        unschedulable_timeout=unschedulable_timeout,
        chief_timeout=chief_timeout,
        cluster_mode=cluster_mode,
    )
