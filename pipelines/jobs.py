"""A TFJob as a pipeline: one pure factory, a `JobSpec` and an image in, a KFP pipeline out.

    create job cluster -> chief (when the job has one) + parameter servers (when it has them) + workers, each running
        the replica's own command -> the chief's model -> publish (when publish_uri is set)

The tasks run in their replica's image (built FROM this project's, or any TF image with this package installed);
the other steps run in this project's image.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl import Model

import components
from components.run_command import chief_model, create_job_cluster, run_command
from components.signatures import declare, pipeline_default
from pipelines.factories import DEFAULT_PODS, DEFAULT_STORAGE
from pipelines.pods import PodSettings, step, training_pod, with_namespace
from pipelines.storage import StorageSettings, with_storage_secret
from trainer.command.tfjob_spec import JobSpec, Replica


def replica_pods(replica: Replica, defaults: PodSettings, deadline: int = 0) -> tuple[PodSettings, list[str]]:
    """The replica's requests and limits and its GPUs as written, and the warnings for what this project fills in.

    A resource the manifest gives a request or a limit for keeps exactly those; one it gives neither for gets this
    project's defaults (a warning says so). `deadline` (runPolicy.activeDeadlineSeconds) is the timeout when set.
    """
    requests, limits = dict(replica.requests), dict(replica.limits)
    values: dict[str, str] = {}
    warnings = []
    for kind in ("cpu", "memory"):
        if kind in requests or kind in limits:
            values[f"{kind}_request"] = requests.get(kind, "")
            values[f"{kind}_limit"] = limits.get(kind, "")
        else:
            values[f"{kind}_request"] = getattr(defaults, f"{kind}_request")
            values[f"{kind}_limit"] = getattr(defaults, f"{kind}_limit")
            warnings.append(
                f"spec.tfReplicaSpecs.{replica.type} resources: no {kind} request or limit; this project's default "
                f"is used (request {values[f'{kind}_request'] or 'none'}, limit {values[f'{kind}_limit'] or 'none'})"
            )
    pod = replica.pod
    accelerator = {"gpus": pod.accelerators, "accelerator": pod.accelerator} if pod.accelerator else {}
    pods = PodSettings(
        **values,
        **accelerator,
        retries=defaults.retries,
        timeout_seconds=deadline or defaults.timeout_seconds,
    )
    return pods, warnings


def _task_pod(task: Any, replica: Replica, pods: PodSettings) -> Any:
    """A task's pod as a training pod of this project, with everything the replica's pod template asks for.

    Its GPUs are set as the MNIST pipeline's are (`pipelines.pods.with_accelerators`, from `replica_pods`); the GPU
    pool's node selector and tolerations are the manifest's own.
    """
    training_pod(task, pods)
    pod = replica.pod
    for mount in replica.mounts:
        kubernetes.mount_pvc(task, pvc_name=mount.claim, mount_path=mount.path, sub_path=mount.sub_path)
    for source in replica.env_from:
        if source.kind == "secret":
            kubernetes.use_secret_as_env(
                task, secret_name=source.ref, secret_key_to_env={source.key: source.name}, optional=source.optional
            )
        elif source.kind == "config_map":
            kubernetes.use_config_map_as_env(
                task,
                config_map_name=source.ref,
                config_map_key_to_env={source.key: source.name},
                optional=source.optional,
            )
        else:
            kubernetes.use_field_path_as_env(task, env_name=source.name, field_path=source.ref)
    for volume in pod.volumes:
        if volume.kind == "secret":
            kubernetes.use_secret_as_volume(
                task, secret_name=volume.source, mount_path=volume.path, optional=volume.optional
            )
        elif volume.kind == "config_map":
            kubernetes.use_config_map_as_volume(
                task, config_map_name=volume.source, mount_path=volume.path, optional=volume.optional
            )
        elif volume.kind == "empty_dir":
            kubernetes.empty_dir_mount(
                task,
                volume_name=volume.name,
                mount_path=volume.path,
                medium=volume.medium or None,
                size_limit=volume.size or None,
            )
        else:
            kubernetes.add_ephemeral_volume(
                task,
                volume_name=volume.name,
                mount_path=volume.path,
                access_modes=list(volume.access_modes),
                size=volume.size,
                storage_class_name=volume.storage_class or None,
            )
    for key, value in pod.node_selector:
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for toleration in pod.tolerations:
        kubernetes.add_toleration(task, **dataclasses.asdict(toleration))
    for term in pod.node_affinity:
        kubernetes.add_node_affinity(
            task,
            match_expressions=[_requirement(r) for r in term.match_expressions] or None,
            match_fields=[_requirement(r) for r in term.match_fields] or None,
            weight=term.weight,
        )
    if pod.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(pod.image_pull_secrets))
    if pod.image_pull_policy:
        kubernetes.set_image_pull_policy(task, pod.image_pull_policy)
    for key, value in pod.labels:
        kubernetes.add_pod_label(task, key, value)
    for key, value in pod.annotations:
        kubernetes.add_pod_annotation(task, key, value)
    identity = {
        "run_as_user": pod.run_as_user,
        "run_as_group": pod.run_as_group,
        "run_as_non_root": pod.run_as_non_root,
    }
    if any(v is not None for v in identity.values()):
        kubernetes.set_security_context(task, **identity)
    return task


def _requirement(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in pairs}


def job_name(job: JobSpec) -> str:
    """The pipeline's name: `tfjob-` and the TFJob's own."""
    return f"tfjob-{job.name}"


def tfjob_pipeline(
    job: JobSpec,
    image: str,
    saved_model: str = "",
    pods: PodSettings = DEFAULT_PODS,
    settings: StorageSettings = DEFAULT_STORAGE,
    defaults: Mapping[str, Any] | None = None,
) -> Any:
    """The pipeline that runs `job`'s replicas as its tasks; this project's own steps run in `image`.

    `pods` fills in what a replica's resources leave out and sets retries and the timeout (the manifest's
    activeDeadlineSeconds first); `defaults` are pipeline parameter defaults (publish_uri, s3_endpoint).
    """
    ops = components.build(image)
    create = dsl.component(declare(create_job_cluster), base_image=image, install_kfp_package=False)
    pick = dsl.component(chief_model, base_image=image, install_kfp_package=False)
    runners = {
        r.type: dsl.component(declare(run_command), base_image=r.image, install_kfp_package=False) for r in job.replicas
    }
    chief, servers, workers = job.replica("chief"), job.replica("ps"), job.replica("worker")
    evaluator = job.replica("evaluator")
    overrides = {**settings.overrides(), **(defaults or {}), "port": job.port}
    overrides["max_restarts"] = job.max_restarts(pipeline_default("max_restarts"))

    def task(replica: Replica, index: Any, cluster: Any, every: dict[str, Any]) -> Any:
        run = runners[replica.type](
            cluster=cluster.outputs["cluster"],
            task_type=replica.type,
            index=index,
            command=[*replica.command, *replica.args],
            env=[list(pair) for pair in replica.env],
            working_dir=replica.working_dir,
            restart_policy=replica.restart_policy,
            success_policy=job.success_policy,
            saved_model=saved_model,
            image=replica.image,
            **every,
        )
        return _task_pod(step(run, replica.type), replica, replica_pods(replica, pods, job.deadline)[0])

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
            evaluator=evaluator is not None,
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
            # They serve until the chief's status says the job is over (trainer.steps.command_task).
            with dsl.ParallelFor(list(range(servers.count)), name="parameter servers") as index:
                task(servers, index, cluster, every)
        if workers:
            with dsl.ParallelFor(cluster.outputs["Output"], name="workers") as index:
                worker = task(workers, index, cluster, every)
        if evaluator:
            # It evaluates beside the training tasks and ends with the chief's task (trainer.command.run).
            task(evaluator, 0, cluster, every)
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
