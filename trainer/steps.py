"""The pipeline's steps as plain typed functions: what each KFP component runs, with paths instead of artifacts.

Every component calls one of these through `trainer.core.entry.run_step`, so every step maps failures with the one
exit-code contract. They take typed values, build the contract's config objects, and return the metadata the
component records on its output artifacts. No kfp import: they run, and are tested, without it.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from trainer.cluster import topology
from trainer.cluster.cluster_record import ClusterRecord
from trainer.config.contract import ClusterConfig, DataConfig, PublishConfig, TrainConfig
from trainer.core.errors import UsageError

if TYPE_CHECKING:
    from trainer.evaluation.verdict import Verdict
    from trainer.publishing.publish import Publication
    from trainer.records.job import JobRecord
    from trainer.serving.kserve import Deployment

log = logging.getLogger(__name__)


def prepare_data(
    output: str,
    source: str,
    max_train_examples: int,
    max_test_examples: int,
    num_shards: int,
    data_uri: str = "",
    run_id: str = "",
    storage: str = "",
    s3_endpoint: str = "",
) -> dict[str, Any]:
    """Prepares the dataset into `output`; returns the counts (and where its shards are) for the Dataset artifact.

    With `data_uri` the shards go to `DATA_URI/<run key>` (`{namespace}` is this pod's), so that no two runs share
    them, and `output` holds only metadata.json naming that place (`trainer.data.sources.run`).
    """
    from trainer.config.contract import StorageConfig
    from trainer.core.runs import run_key
    from trainer.data import sources
    from trainer.k8s import objects
    from trainer.storage import kfpstore

    place = kfpstore.expand(DataConfig(data_uri=data_uri).data_uri, objects.namespace_if_pod() if data_uri else None)
    if place and run_id:
        place = f"{place.rstrip('/')}/{run_key(run_id)}"
    endpoint = ""
    if place.startswith("s3://"):
        endpoint = kfpstore.store(StorageConfig(storage=storage, s3_endpoint=s3_endpoint), None).endpoint
    data = DataConfig(
        source=source,
        max_train_examples=max_train_examples,
        max_test_examples=max_test_examples,
        num_shards=num_shards,
        data_uri=place,
    )
    meta = sources.run(data, output, endpoint)
    counts: dict[str, Any] = {
        "source": source,
        "train_examples": meta.num_examples("train"),
        "test_examples": meta.num_examples("test"),
    }
    if meta.num_classes:
        counts["num_classes"] = meta.num_classes
    if meta.location:
        counts["location"] = meta.location
    return counts


def _topology(
    run_id: str,
    cluster_mode: str,
    port: int,
    num_workers: int,
    num_ps: int = 0,
    chief: bool = False,
    evaluator: bool = False,
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Every task's address and its supervisor's control address, shaped alike (`assign_addresses`).

    Kubernetes mode names one headless Service per task in this pod's namespace (each task creates its own when it
    joins), its control address the next port; local mode picks free loopback ports.
    """
    from trainer.cluster.local_processes import local_topology
    from trainer.k8s import objects

    if cluster_mode == "local":
        return local_topology(num_workers, num_ps, chief, evaluator)
    tasks = topology.task_count(num_workers, num_ps, chief, evaluator)
    addresses = objects.task_addresses(run_id, tasks, objects.namespace(), port)
    control = [topology.next_port(a) for a in addresses]
    return (
        topology.assign_addresses(addresses, num_workers, num_ps, chief, evaluator),
        topology.assign_addresses(control, num_workers, num_ps, chief, evaluator),
    )


def create_cluster(
    output_dir: str, run_id: str, num_workers: int, cluster_mode: str, port: int, num_ps: int = 0
) -> ClusterRecord:
    """Gives every task of the run an address (and its supervisor a control address) and writes cluster.json.

    The addresses are `_topology`'s. The record also holds a fresh secret for the run's control channel
    (`trainer.cluster.cluster_record`); the returned record's metadata leaves it out.
    """
    settings = ClusterConfig(num_workers=num_workers, cluster_mode=cluster_mode, port=port, num_ps=max(num_ps, 1))
    spec, control = _topology(run_id, settings.cluster_mode, port, num_workers, num_ps)
    record = ClusterRecord.new(spec, control, settings.cluster_mode)
    record.write(output_dir)
    return record


def create_job_cluster(
    output_dir: str,
    run_id: str,
    chief: bool,
    num_workers: int,
    cluster_mode: str,
    port: int,
    num_ps: int = 0,
    evaluator: bool = False,
) -> ClusterRecord:
    """A user's TFJob-shaped job's cluster.json (as `create_cluster`): chief, parameter servers, workers, evaluator.

    The Evaluator is in the cluster of TF_CONFIG, as the operator put it there (`genClusterSpec`); its control
    address is never served or asked (it never restarts with the training tasks).
    """
    from trainer.config import settings

    settings.check("cluster_mode", cluster_mode)
    settings.check("port", port)
    spec, control = _topology(run_id, cluster_mode, port, num_workers, num_ps, chief, evaluator)
    record = ClusterRecord.new(spec, control, cluster_mode)
    record.write(output_dir)
    return record


def _storage_defaults(config: TrainConfig) -> TrainConfig:
    """Kubernetes mode: checkpoints on the claim, or in the pod.

    Without a claim or a `checkpoint_dir`, checkpoints stay on the pod's own disk (`trainer.cluster.resume.root_of`):
    a replaced pod starts without them and a survivor hands its copy over (`trainer.cluster.resume`).
    """
    from trainer.cluster.resume import root_of
    from trainer.k8s import checkpoints

    if config.cluster.cluster_mode != "kubernetes":
        return config
    config = checkpoints.on_claim(config)
    if not config.runtime.checkpoint_dir:
        config = config.replace(checkpoint_dir=root_of(""))
    return config


def train_task(
    dataset: str, cluster_dir: str, job: str, index: int, model_dir: str, run_id: str, **settings: Any
) -> dict[str, Any]:
    """Runs one task of the run's cluster under the supervisor (`trainer.cluster.lifecycle.run_cluster_task`).

    Args:
        dataset: the prepared dataset.
        cluster_dir: create_cluster's output directory.
        job: `worker`, `chief` or `ps`.
        index: the task's index within its job.
        model_dir: where the chief writes the model (the others, their task record, worker.json).
        run_id: the pipeline run's id.
        **settings: contract settings by name (epochs, batch_size, startup_timeout, cluster_mode, ...).

    Returns:
        The metadata of the task's Model artifact.

    Raises:
        TaskFailedError: the training process failed; its own `error:` line says why, its exit code is kept.
    """
    from trainer.cluster.lifecycle import Placement, Trainer, run_cluster_task

    config = _storage_defaults(
        TrainConfig.from_settings(data_dir=dataset, model_dir=model_dir, run_id=run_id, **settings)
    )
    cluster = config.cluster
    placement = Placement(
        cluster_dir, job, index, run_id, cluster.cluster_mode, cluster.startup_timeout, cluster.unschedulable_timeout
    )
    return run_cluster_task(placement, Trainer(config))


def command_task(
    cluster_dir: str,
    task_type: str,
    index: int,
    model_dir: str,
    run_id: str,
    unschedulable_timeout: float,
    **command_settings: Any,
) -> dict[str, Any]:
    """Runs a user's command as task `task_type`:`index` of the run's job under the supervisor (command mode).

    The same path as `train_task` (`trainer.cluster.lifecycle.run_cluster_task`), with TF_CONFIG as TFJob's operator
    built it and the work `trainer.command.run.Command` describes.

    Args:
        cluster_dir: create_job_cluster's output directory.
        task_type: chief, ps, worker or evaluator.
        index: the task's index within its type.
        model_dir: the task's `MODEL_DIR`.
        run_id: the pipeline run's id.
        unschedulable_timeout: seconds a task may wait for a peer's pod to be scheduled (Kubernetes mode).
        **command_settings: the command and its settings by name (`Command`'s attributes).

    Returns:
        The metadata of the task's Model artifact: the chief's reported metrics, or the task record.

    Raises:
        UsageError: a bad setting, or a chief that wrote no SavedModel; nothing was started or kept.
        TaskFailedError: the command failed for good; its exit code is kept.
    """
    from trainer.cluster.lifecycle import Placement, run_cluster_task
    from trainer.command import tfjob_spec
    from trainer.command.run import Command
    from trainer.config import settings

    command = Command(model_dir=model_dir, run_id=run_id, **command_settings)
    settings.check("unschedulable_timeout", unschedulable_timeout)
    command.check()
    placement = Placement(
        cluster_dir,
        task_type,
        index,
        run_id,
        command.cluster_mode,
        command.startup_timeout,
        unschedulable_timeout,
        environment=tfjob_spec.TF_CONFIG_ENVIRONMENT,
        alone_undistributed=True,
    )
    return run_cluster_task(placement, command)


def _the_chief(model_dirs: list[str], holds: str, what: str) -> str:
    """The one model directory of `model_dirs` that holds `holds` (what only the chief writes).

    Raises:
        UsageError: none or several hold it.
    """
    chiefs = [d for d in model_dirs if os.path.exists(os.path.join(d, holds))]
    if len(chiefs) != 1:
        raise UsageError(f"expected exactly one {what}, found {len(chiefs)} of {len(model_dirs)}")
    return chiefs[0]


def job_model(model_dirs: list[str], chief_copy: str) -> tuple[str, JobRecord]:
    """A command-mode job's chief model (the one with job.json) copied to `chief_copy`: its directory and record."""
    import shutil

    from trainer.records.job import JobRecord

    chief = _the_chief(model_dirs, JobRecord.FILE, f"chief model ({JobRecord.FILE})")
    shutil.copytree(chief, chief_copy)
    return chief, JobRecord.read(chief_copy)


def evaluate(
    dataset: str, model_dirs: list[str], report: str, chief_copy: str, min_accuracy: float, gate: str = ""
) -> Verdict:
    """Evaluates the chief's model, runs the serving check, writes the HTML report, copies the model.

    The model's kind (`trainer.modeling.kinds.of_history`) evaluates it: the built-in CNN's exported SavedModel on
    the held-out images (accuracy, loss, per class); a model_fn's model on the metrics it was compiled with. Its
    serving check (`trainer.serving.serving_check`) serves the SavedModel in a fresh process the way TF Serving does and
    compares its answers for the first held-out examples with the evaluation's.

    Returns:
        The verdict: the results, the gate, the serving check, and so the publish decision.

    Raises:
        UsageError: the gate names a metric the evaluation does not report, or a metric of the model has a name the
            step's own records use.
    """
    import shutil

    from trainer.config.gate import Gate
    from trainer.evaluation.report import write_html
    from trainer.evaluation.verdict import BOOKKEEPING, Verdict
    from trainer.modeling import kinds
    from trainer.records.history import History
    from trainer.records.model_dir import SAVED_MODEL_DIR
    from trainer.serving import serving_check

    settings = PublishConfig(min_accuracy=min_accuracy, gate=gate)
    bar = Gate.of(settings.gate, settings.min_accuracy)
    chief = _the_chief(model_dirs, SAVED_MODEL_DIR, "worker model with a SavedModel")
    history = History.read(chief)
    saved_model = os.path.join(chief, SAVED_MODEL_DIR)
    kind = kinds.of_history(history)
    results, sample = kind.evaluate(chief, dataset, serving_check.EXAMPLES)
    bar.value(results.scalars())
    taken = sorted(set(results.scalars()) & {*BOOKKEEPING, "source_uri", "gate", "serving_check"})
    if taken:
        raise UsageError(
            f"{kind.name} compiles metrics named {', '.join(taken)}, which the evaluate step records for itself; "
            "allowed: other names (metrics=[...(name=...)])"
        )
    check = kind.serving_check(saved_model, sample)
    verdict = Verdict(results, bar, check, chief)
    write_html(report, verdict, history, kind.html_name())
    shutil.copytree(chief, chief_copy)
    return verdict


def publish_model(
    model_dir: str,
    metrics: dict[str, Any],
    publish_uri: str,
    model_uri: str = "",
    s3_endpoint: str = "",
    storage: str = "",
    gate: str = "",
) -> Publication:
    """Publishes the model behind the gate unless a better one is published; lineage comes from its history.json.

    `{namespace}` in `publish_uri` is this pod's namespace; `storage` `kfp` publishes to KFP's own object store; the
    gate's metric and direction (`gate`, else accuracy) say which of two models is better.
    """
    from trainer.config.contract import StorageConfig
    from trainer.config.gate import Gate
    from trainer.k8s import objects
    from trainer.k8s.volumes import on_own_disk
    from trainer.publishing.publish import check_target, publish
    from trainer.records.history import History
    from trainer.records.model_dir import SAVED_MODEL_DIR
    from trainer.storage import kfpstore

    target = PublishConfig(publish_uri=publish_uri, gate=gate)
    namespace = objects.namespace_if_pod()
    uri = kfpstore.expand(target.publish_uri, namespace)
    store = kfpstore.store(StorageConfig(storage=storage, s3_endpoint=s3_endpoint), namespace)
    check_target(uri, store.endpoint)
    if namespace is not None and "://" not in uri and on_own_disk(uri):
        raise UsageError(
            f"publish_uri {uri!r} is on this pod's own disk (no volume is mounted there), so the published model "
            "would be gone with the pod; allowed: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, or a path on a volume "
            "mounted into the publish step"
        )
    from trainer.records.job import JobRecord

    # A command-mode chief writes job.json instead of history.json; without either, History.read says what is missing.
    if os.path.isfile(os.path.join(model_dir, JobRecord.FILE)) and not os.path.isfile(
        os.path.join(model_dir, History.FILE)
    ):
        record = JobRecord.read(model_dir)
    else:
        record = History.read(model_dir)
    lineage = {**record.lineage, "model_uri": model_uri or model_dir}
    return publish(
        os.path.join(model_dir, SAVED_MODEL_DIR),
        metrics,
        uri,
        lineage,
        store.endpoint,
        store.refused,
        Gate.of(target.gate, target.min_accuracy),
    )


def deploy_model(
    publish_uri: str,
    serving_name: str,
    serving_timeout: float,
    serving_runtime_version: str,
    version: int,
    published_path: str,
    storage: str = "",
    s3_endpoint: str = "",
    api: Any = None,
    poll: float | None = None,
) -> Deployment:
    """Serves the published model with the KServe InferenceService `serving_name`; off when that is empty.

    Creates or patches it in this pod's namespace and waits until it is Ready. `version` and `published_path` are
    what latest.json names after the publish step (the best model published so far), as its decision records. For an
    s3:// location the InferenceService's storage initializer gets this step's own keys and the store's endpoint
    (`trainer.serving.kserve.s3_credentials`).

    Returns:
        The deployment (`trainer.serving.kserve.Deployment`): whether and why, and the InferenceService serving it.

    Raises:
        UsageError: a bad setting, or nothing published; nothing was sent to the cluster.
        KubernetesError: the API refused a call, or the rollout failed (the previous revision keeps serving).
    """
    from trainer.config.contract import ServingConfig, StorageConfig
    from trainer.k8s import objects
    from trainer.serving import kserve
    from trainer.storage import kfpstore

    settings = ServingConfig(
        serving_name=serving_name, serving_timeout=serving_timeout, serving_runtime_version=serving_runtime_version
    )
    if not settings.serving_name:
        return kserve.Deployment.skipped("not deployed: serving_name is empty")
    uri = kfpstore.expand(PublishConfig(publish_uri=publish_uri).publish_uri, objects.namespace_if_pod())
    location = kserve.storage_uri(uri)
    if not version:
        raise UsageError(f"nothing is published at publish_uri {publish_uri!r} (version {version!r}); nothing to serve")
    namespace = objects.namespace()
    credentials = None
    if location.startswith("s3://") and all(os.environ.get(key) for key in kserve.S3_KEYS):
        store = kfpstore.store(StorageConfig(storage=storage, s3_endpoint=s3_endpoint), namespace)
        endpoint = store.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3", "")
        keys = {key: os.environ[key] for key in kserve.S3_KEYS}
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or kserve.DEFAULT_REGION
        credentials = kserve.s3_credentials(settings.serving_name, endpoint, keys, region)
    if api is None:
        api = objects.custom_objects_api()
    deployment = kserve.deploy(
        api,
        namespace,
        settings.serving_name,
        location,
        settings.serving_runtime_version,
        version,
        published_path,
        settings.serving_timeout,
        kserve.POLL_SECONDS if poll is None else poll,
        credentials,
    )
    log.info(deployment.reason)
    return deployment
