"""The command-mode steps: a job's cluster, each task running the user's own command, and the chief's model."""

from kfp.dsl import Artifact, Input, Metrics, Model, Output


def create_job_cluster(
    cluster: Output[Artifact],
    chief: bool,
    evaluator: bool,
    num_ps: int,
    run_id: str,
    num_workers: int,
    cluster_mode: str,
    port: int,
) -> list[int]:
    """Gives each task of the job (chief, parameter servers, workers, evaluator) an address every task reaches.

    Args:
        cluster: cluster.json: the cluster spec of the job's TF_CONFIG, and its supervisors' addresses.
        chief: whether the job has a Chief replica.
        evaluator: whether the job has an Evaluator replica.
        num_ps: the PS replicas (0: none).
        num_workers: the Worker replicas (0: none, a job of a Chief alone).

    Returns:
        The worker indices [0, 1, ..., num_workers - 1]: the items of the workers' ParallelFor.
    """
    from trainer import steps
    from trainer.core.entry import run_step

    record = run_step(
        steps.create_job_cluster,
        output_dir=cluster.path,
        run_id=run_id,
        chief=chief,
        evaluator=evaluator,
        num_workers=num_workers,
        cluster_mode=cluster_mode,
        port=port,
        num_ps=num_ps,
    )
    cluster.metadata.update(record.to_json())
    return list(range(num_workers))


def run_command(
    cluster: Input[Artifact],
    task_type: str,
    index: int,
    command: list,
    env: list,
    working_dir: str,
    restart_policy: str,
    success_policy: str,
    saved_model: str,
    image: str,
    model: Output[Model],
    run_id: str,
    startup_timeout: float,
    unschedulable_timeout: float,
    max_restarts: int,
    checkpoint_dir: str,
    cluster_mode: str,
    chief_timeout: float,
):
    """Runs the replica's own command as one task of the job, with TF_CONFIG as TFJob's operator generated it.

    The command runs under this project's supervisor: Service and peer waits on a cluster, a start-up watchdog,
    restarts in place by the replica's restart policy, prompt stop on SIGTERM. Its environment names MODEL_DIR and
    CHECKPOINT_DIR. In a job with parameter servers, the ps and worker tasks end when the chief's status says the job
    is over.

    Args:
        cluster: the job's cluster.json from create_job_cluster.
        task_type: chief, ps or worker.
        index: this task's index within its type.
        command: the replica's command and args; `$(NAME)` is expanded from the environment as in a pod.
        env: the replica's environment variables, [name, value] pairs in the manifest's order (a value may use
            `$(NAME)` of the variables before it, as in a pod).
        working_dir: the directory the command runs in (the container's workingDir; empty: the image's).
        restart_policy: the replica's TFJob restartPolicy (Never, OnFailure, ExitCode).
        success_policy: the TFJob's successPolicy: empty (the chief's success is the job's) or AllWorkers.
        saved_model: where the chief's command writes its SavedModel (default $(MODEL_DIR)/saved_model).
        image: the replica's image, recorded in the model's lineage.
        model: on the chief, saved_model/, job.json and the command's own metrics.json if it wrote one; on the
            others, worker.json.
    """
    from trainer import steps
    from trainer.core.entry import run_step

    model.metadata.update(
        run_step(
            steps.command_task,
            cluster_dir=cluster.path,
            task_type=task_type,
            index=index,
            model_dir=model.path,
            run_id=run_id,
            command=command,
            env=env,
            working_dir=working_dir,
            restart_policy=restart_policy,
            success_policy=success_policy,
            saved_model=saved_model,
            image=image,
            startup_timeout=startup_timeout,
            unschedulable_timeout=unschedulable_timeout,
            max_restarts=max_restarts,
            checkpoint_dir=checkpoint_dir,
            cluster_mode=cluster_mode,
            chief_timeout=chief_timeout,
        )
    )


def chief_model(models: Input[list[Model]], model: Output[Model], metrics: Output[Metrics]):
    """Passes on the chief's model of a command-mode job and the metrics its command reported.

    Args:
        models: every task's model; exactly one holds job.json (the chief's).
        model: the chief's model directory (saved_model/, job.json).
        metrics: the numbers the command wrote to $(MODEL_DIR)/metrics.json (none when it wrote none).
    """
    from trainer import steps
    from trainer.core.entry import run_step

    paths = {m.path: m.uri for m in models}
    chief, record = run_step(steps.job_model, model_dirs=list(paths), chief_copy=model.path)
    model.metadata.update({"source_uri": paths[chief], "task": record.task, "restarts": record.restarts})
    metrics.metadata.update(record.metrics)
