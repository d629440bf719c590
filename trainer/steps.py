"""The pipeline's steps as plain typed functions: what each KFP component runs, with paths instead of artifacts.

Every component calls one of these through `trainer.cli.run_step`, so every step maps failures with the one
exit-code contract. They take typed values, build the contract's config objects, and return the metadata the
component records on its output artifacts. No kfp import: they run, and are tested, without it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from trainer.cluster import tf_config as cluster_lib
from trainer.cluster.record import ClusterRecord
from trainer.config.contract import ClusterConfig, DataConfig, PublishConfig, TrainConfig
from trainer.core.errors import TaskFailedError, UsageError
from trainer.core.files import write_json

if TYPE_CHECKING:
    from trainer.command.record import JobRecord
    from trainer.evaluation.verdict import Verdict
    from trainer.storage.publish import Publication

log = logging.getLogger(__name__)

WORKER_FILE = "worker.json"


def prepare_data(
    output: str, source: str, max_train_examples: int, max_test_examples: int, num_shards: int
) -> dict[str, Any]:
    """Prepares the dataset into `output`; returns the counts the Dataset artifact records."""
    from trainer.data import sources as prepare

    data = DataConfig(
        source=source, max_train_examples=max_train_examples, max_test_examples=max_test_examples, num_shards=num_shards
    )
    meta = prepare.run(data, output)
    counts = {
        "source": source,
        "train_examples": meta["splits"]["train"]["num_examples"],
        "test_examples": meta["splits"]["test"]["num_examples"],
    }
    if "num_classes" in meta:
        counts["num_classes"] = meta["num_classes"]
    return counts


def create_cluster(
    output_dir: str, run_id: str, num_workers: int, cluster_mode: str, port: int, num_ps: int = 0
) -> ClusterRecord:
    """Gives every task of the run an address (and its supervisor a control address) and writes cluster.json.

    Kubernetes mode names one headless Service per task in this pod's namespace (each task creates its own when it
    joins); local mode picks free loopback ports. The record also holds a fresh secret for the run's control channel
    (`trainer.cluster.record`); the returned record's metadata leaves it out.
    """
    from trainer.cluster.local import local_topology
    from trainer.k8s import objects as k8s

    settings = ClusterConfig(num_workers=num_workers, cluster_mode=cluster_mode, port=port, num_ps=max(num_ps, 1))
    if settings.cluster_mode == "local":
        spec, control = local_topology(num_workers, num_ps)
    else:
        tasks = num_workers + (num_ps + 1 if num_ps else 0)
        addresses = k8s.task_addresses(run_id, tasks, k8s.namespace(), port)
        spec = cluster_lib.assign_addresses(addresses, num_workers, num_ps)
        control = cluster_lib.assign_addresses([cluster_lib.next_port(a) for a in addresses], num_workers, num_ps)
    record = ClusterRecord.new(spec, control, settings.cluster_mode)
    record.write(output_dir)
    return record


def _storage_defaults(config: TrainConfig) -> TrainConfig:
    """Kubernetes mode: checkpoints on the claim, or in the pod.

    Without a claim or a `checkpoint_dir`, checkpoints stay in the pod's own temporary directory: a replaced pod
    starts without them and a survivor hands its copy over (`trainer.cluster.resume`).
    """
    import tempfile

    from trainer.k8s import claims as checkpoints

    if config.cluster.cluster_mode != "kubernetes":
        return config
    config = checkpoints.on_claim(config)
    if not config.runtime.checkpoint_dir:
        config = config.replace(checkpoint_dir=os.path.join(tempfile.gettempdir(), "tf-checkpoints"))
    return config


def train_task(
    dataset: str, cluster_dir: str, job: str, index: int, model_dir: str, run_id: str, **settings: Any
) -> dict[str, Any]:
    """Runs one task of the run's cluster under the supervisor (joining the Kubernetes cluster first when asked).

    Args:
        dataset: the prepared dataset.
        cluster_dir: create_cluster's output directory.
        job: `worker`, `chief` or `ps`.
        index: the task's index within its job.
        model_dir: where the chief writes the model.
        run_id: the pipeline run's id.
        **settings: contract settings by name (epochs, batch_size, startup_timeout, cluster_mode, ...).

    Returns:
        The metadata of the task's Model artifact.

    Raises:
        TaskFailedError: the training process failed; its own `error:` line says why, its exit code is kept.
    """
    from trainer.cluster.supervisor import supervise
    from trainer.k8s import discovery

    config = _storage_defaults(
        TrainConfig.from_settings(data_dir=dataset, model_dir=model_dir, run_id=run_id, **settings)
    )
    record = ClusterRecord.read(cluster_dir)
    tf_config = cluster_lib.build_tf_config(record.cluster, job, index)
    log.info("%s %d joins the cluster %s", job, index, json.dumps(record.cluster))
    kubernetes = config.cluster.cluster_mode == "kubernetes"
    position = (
        discovery.join_cluster(
            record.cluster, job, index, run_id, config.cluster.startup_timeout, config.cluster.unschedulable_timeout
        )
        if kubernetes
        else None
    )
    try:
        code = supervise(config, tf_config, record.control, secret=record.secret)
    finally:
        if kubernetes:
            discovery.leave_cluster(run_id, position)
    if code:
        raise TaskFailedError(code)
    chief = cluster_lib.is_chief(tf_config)
    if job == "worker" and not chief:
        os.makedirs(model_dir, exist_ok=True)
        write_json(os.path.join(model_dir, WORKER_FILE), {"worker_index": index, "chief": False})
    return {"task": f"{job}:{index}", "chief": chief, "strategy": config.cluster.strategy, "framework": "tensorflow"}


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

    from trainer.command.record import JobRecord

    chief = _the_chief(model_dirs, JobRecord.FILE, f"chief model ({JobRecord.FILE})")
    shutil.copytree(chief, chief_copy)
    return chief, JobRecord.read(chief_copy)


def evaluate(
    dataset: str, model_dirs: list[str], report: str, chief_copy: str, min_accuracy: float, gate: str = ""
) -> Verdict:
    """Evaluates the chief's model, runs the serving check, writes the HTML report, copies the model.

    The built-in CNN's exported SavedModel is evaluated on the held-out images (accuracy, loss, per class); a
    model_fn's model reports the metrics it was compiled with. The serving check (`trainer.serving.check`) serves the
    SavedModel in a fresh process the way TF Serving does and compares its answers for the first held-out examples
    with the evaluation's.

    Returns:
        The verdict: the results, the gate, the serving check, and so the publish decision.

    Raises:
        UsageError: the gate names a metric the evaluation does not report, or a metric of the model has a name the
            step's own records use.
    """
    import shutil

    from trainer.evaluation import metrics as evaluation
    from trainer.evaluation.gate import Gate
    from trainer.evaluation.model_metrics import evaluate_model
    from trainer.evaluation.report import write_html
    from trainer.evaluation.verdict import BOOKKEEPING, Verdict
    from trainer.modeling.export import SAVED_MODEL_DIR
    from trainer.serving import check as serving_check
    from trainer.training.history import History

    settings = PublishConfig(min_accuracy=min_accuracy, gate=gate)
    bar = Gate.of(settings.gate, settings.min_accuracy)
    chief = _the_chief(model_dirs, SAVED_MODEL_DIR, "worker model with a SavedModel")
    history = History.read(chief)
    saved_model = os.path.join(chief, SAVED_MODEL_DIR)
    if history.model_fn:
        results, sample = evaluate_model(chief, dataset, serving_check.EXAMPLES)
        bar.value(results.scalars())
        taken = sorted(set(results.scalars()) & {*BOOKKEEPING, "source_uri", "gate", "serving_check"})
        if taken:
            raise UsageError(
                f"model_fn {history.model_fn!r} compiles metrics named {', '.join(taken)}, which the evaluate step "
                f"records for itself; allowed: other names (metrics=[...(name=...)])"
            )
        check = serving_check.run_outputs(saved_model, sample.features, sample.predictions)
    else:
        results, images, probabilities = evaluation.evaluate_split(chief, dataset)
        bar.value(results.scalars())
        count = min(len(images), serving_check.EXAMPLES)
        check = serving_check.run(saved_model, images[:count], probabilities[:count])
    verdict = Verdict(results, bar, check, chief)
    write_html(report, verdict, history)
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
    from trainer.evaluation.gate import Gate
    from trainer.k8s import objects as k8s
    from trainer.k8s.volumes import on_own_disk
    from trainer.modeling.export import SAVED_MODEL_DIR
    from trainer.storage import kfp as kfpstore
    from trainer.storage.publish import check_target, publish
    from trainer.training.history import History

    target = PublishConfig(publish_uri=publish_uri, gate=gate)
    namespace = k8s.namespace_if_pod()
    uri = kfpstore.expand(target.publish_uri, namespace)
    store = kfpstore.store(StorageConfig(storage=storage, s3_endpoint=s3_endpoint), namespace)
    check_target(uri, store.endpoint)
    if namespace is not None and "://" not in uri and on_own_disk(uri):
        raise UsageError(
            f"publish_uri {uri!r} is on this pod's own disk (no volume is mounted there), so the published model "
            "would be gone with the pod; allowed: s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, or a path on a volume "
            "mounted into the publish step"
        )
    from trainer.command.record import JobRecord

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
) -> dict[str, Any]:
    """Serves the published model with the KServe InferenceService `serving_name`; off when that is empty.

    Creates or patches it in this pod's namespace and waits until it is Ready. `version` and `published_path` are
    what latest.json names after the publish step (the best model published so far), as its decision records. For an
    s3:// location the InferenceService's storage initializer gets this step's own keys and the store's endpoint
    (`trainer.serving.kserve.s3_credentials`).

    Returns:
        `deployed` and `reason`, and when deployed the InferenceService's `url`, `predict_url`, `version`, ...

    Raises:
        UsageError: a bad setting, or nothing published; nothing was sent to the cluster.
        KubernetesError: the API refused a call, or the rollout failed (the previous revision keeps serving).
    """
    from trainer.config.contract import ServingConfig, StorageConfig
    from trainer.k8s import objects as k8s
    from trainer.serving import kserve
    from trainer.storage import kfp as kfpstore

    settings = ServingConfig(
        serving_name=serving_name, serving_timeout=serving_timeout, serving_runtime_version=serving_runtime_version
    )
    if not settings.serving_name:
        return {"deployed": False, "reason": "not deployed: serving_name is empty"}
    uri = kfpstore.expand(PublishConfig(publish_uri=publish_uri).publish_uri, k8s.namespace_if_pod())
    location = kserve.storage_uri(uri)
    if not version:
        raise UsageError(f"nothing is published at publish_uri {publish_uri!r} (version {version!r}); nothing to serve")
    namespace = k8s.namespace()
    credentials = None
    if location.startswith("s3://") and all(os.environ.get(key) for key in kserve.S3_KEYS):
        store = kfpstore.store(StorageConfig(storage=storage, s3_endpoint=s3_endpoint), namespace)
        endpoint = store.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3", "")
        keys = {key: os.environ[key] for key in kserve.S3_KEYS}
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or kserve.DEFAULT_REGION
        credentials = kserve.s3_credentials(settings.serving_name, endpoint, keys, region)
    if api is None:
        api = k8s.custom_objects_api()
    result = kserve.deploy(
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
    reason = f"InferenceService {settings.serving_name} serves version {version} at {result['url']}"
    log.info(reason)
    return {"deployed": True, "reason": reason, "version": version, **result}
