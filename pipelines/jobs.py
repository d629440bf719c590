"""A TFJob as a pipeline: one pure factory, a `JobSpec` and an image in, a KFP pipeline out.

    create job cluster -> chief (when the job has one) + parameter servers (when it has them) + workers, each running
        the replica's own command -> the chief's model -> publish (when publish_uri is set)

The tasks run in their replica's image (built FROM this project's, or any TF image with this package installed);
the other steps run in this project's image.
"""

from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl import Model

import components
from components.contract import declare
from components.run_command import chief_model, create_job_cluster, run_command
from pipelines.factories import DEFAULT_PODS, DEFAULT_STORAGE
from pipelines.pods import PodSettings, step, training_pod, with_namespace
from pipelines.storage import StorageSettings, with_storage_secret
from trainer.command.tfjob import JobSpec, Replica


def _pods(replica: Replica, defaults: PodSettings) -> PodSettings:
    """The replica's own requests and limits, this project's defaults for what it leaves out."""
    requests, limits = dict(replica.requests), dict(replica.limits)
    return PodSettings(
        cpu_request=requests.get("cpu", limits.get("cpu", defaults.cpu_request)),
        cpu_limit=limits.get("cpu", defaults.cpu_limit),
        memory_request=requests.get("memory", limits.get("memory", defaults.memory_request)),
        memory_limit=limits.get("memory", defaults.memory_limit),
        retries=defaults.retries,
        timeout_seconds=defaults.timeout_seconds,
    )


def _task_pod(task: Any, replica: Replica, defaults: PodSettings) -> Any:
    """A task's pod as a training pod of this project, with the replica's claims, Secrets and resources."""
    training_pod(task, _pods(replica, defaults))
    for mount in replica.mounts:
        kubernetes.mount_pvc(task, pvc_name=mount.claim, mount_path=mount.path)
    for secret in replica.secret_env:
        kubernetes.use_secret_as_env(task, secret_name=secret.secret, secret_key_to_env={secret.key: secret.name})
    return task


def job_name(job: JobSpec) -> str:
    """The pipeline's name: `tfjob-` and the TFJob's own."""
    return f"tfjob-{job.name}"


def tfjob_pipeline(
    job: JobSpec,
    image: str,
    saved_model: str = "",
    pods: PodSettings = DEFAULT_PODS,
    settings: StorageSettings = DEFAULT_STORAGE,
) -> Any:
    """The pipeline that runs `job`'s replicas as its tasks; this project's own steps run in `image`."""
    ops = components.build(image)
    create = dsl.component(declare(create_job_cluster), base_image=image, install_kfp_package=False)
    pick = dsl.component(chief_model, base_image=image, install_kfp_package=False)
    runners = {
        r.type: dsl.component(declare(run_command), base_image=r.image, install_kfp_package=False) for r in job.replicas
    }
    chief, servers, workers = job.replica("chief"), job.replica("ps"), job.replica("worker")
    overrides = {**settings.overrides(), "port": job.port}
    if any(r.restart_policy == "Never" for r in job.replicas):
        overrides["max_restarts"] = 0

    def task(replica: Replica, index: Any, cluster: Any, every: dict[str, Any]) -> Any:
        run = runners[replica.type](
            cluster=cluster.outputs["cluster"],
            task_type=replica.type,
            index=index,
            command=[*replica.command, *replica.args],
            env=dict(replica.env),
            restart_policy=replica.restart_policy,
            saved_model=saved_model,
            image=replica.image,
            **every,
        )
        return _task_pod(step(run, replica.type), replica, pods)

    def pipeline(
        cluster_mode: str,
        port: int,
        startup_timeout: float,
        unschedulable_timeout: float,
        max_restarts: int,
        checkpoint_dir: str,
        chief_timeout: float,
        publish_uri: str,
        storage: str,
        s3_endpoint: str,
    ) -> Model:
        """Runs the TFJob's replicas, each its own command with TF_CONFIG as TFJob's operator generated it.

        create job cluster -> chief + parameter servers + workers (the user's command) -> the chief's model -> publish.
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        cluster = create(
            run_id=run_id,
            chief=chief is not None,
            num_ps=servers.count if servers else 0,
            num_workers=workers.count if workers else 0,
            cluster_mode=cluster_mode,
            port=port,
        )
        with_namespace(step(cluster, "create job cluster"))
        every = {
            "run_id": run_id,
            "startup_timeout": startup_timeout,
            "unschedulable_timeout": unschedulable_timeout,
            "max_restarts": max_restarts,
            "checkpoint_dir": checkpoint_dir,
            "cluster_mode": cluster_mode,
            "chief_timeout": chief_timeout,
        }
        if chief:
            # A one-item loop, so that its model is collected as the workers' would be (dsl.Collected needs a loop).
            with dsl.ParallelFor([0], name="chief") as index:
                lead = task(chief, index, cluster, every)
        if servers:
            # They serve until the chief's status says the job is over (trainer.command.run.command_task).
            with dsl.ParallelFor(list(range(servers.count)), name="parameter servers") as index:
                task(servers, index, cluster, every)
        if workers:
            with dsl.ParallelFor(cluster.outputs["Output"], name="workers") as index:
                worker = task(workers, index, cluster, every)
        models = dsl.Collected((lead if chief else worker).outputs["model"])
        picked = step(pick(models=models), "chief model")
        with dsl.If(publish_uri != "", name="publish location set"):
            published = ops.publish_model(
                model=picked.outputs["model"],
                metrics=picked.outputs["metrics"],
                publish_uri=publish_uri,
                storage=storage,
                s3_endpoint=s3_endpoint,
            )
            with_storage_secret(with_namespace(step(published, "publish model")), settings)
        return picked.outputs["model"]

    return dsl.pipeline(name=job_name(job))(declare(pipeline, overrides))
