"""The configuration contract: every setting of preparation, training and the cluster, declared once.

Each setting is a field of a frozen dataclass with its type, default, help text and the values it allows. The
trainer CLIs' flags (`trainer.config.flags`), the components' and the pipeline's parameter defaults and descriptions
(`components.signatures`) are derived from these declarations; `components.signatures.PIPELINE_OVERRIDES` lists the
few defaults a pipeline run on a cluster changes, each with its reason. Construction checks every field, so a
config that exists is valid.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.config.checks import (
    FLAG,
    GATE_FORM,
    SOURCE_FORMS,
    Check,
    Checked,
    at_least,
    comma_list,
    dns_subdomain_or_empty,
    image_tag,
    int_between,
    is_source,
    kserve_name_or_empty,
    location,
    non_empty,
    number_between,
    one_of,
    parse_gate,
    s3_endpoint,
    setting,
    text,
)
from trainer.core.errors import UsageError
from trainer.core.functions import FUNCTION_FORM, is_function

STRATEGIES = ("multi_worker_mirrored", "parameter_server")
CLUSTER_MODES = ("kubernetes", "local")
MAX_WORKERS = 64
MAX_PREPARE_WORKERS = 1024
# A process that writes shards costs its start (~0.2 s of a core) and the ring's traffic: below this many examples of
# its own, writing them in a process of their own saves less than that (`trainer.data.writers`).
MIN_EXAMPLES_PER_PREPARE_WORKER = 200_000
# KServe's own rule for an InferenceService name (IsvcNameFmt in its v1beta1 validation), at most a DNS label long.


@dataclasses.dataclass(frozen=True)
class DataConfig(Checked):
    """Which data, how much of it, and how it is read."""

    source: str = setting(
        "tfds:mnist",
        "where the data comes from: 'sample' (the MNIST digits shipped in the image), "
        "'idx:DIR_OR_URI' (MNIST-format IDX files at a local path or a tf.io.gfile URI), a TFDS "
        "name such as 'mnist' or 'tfds:fashion_mnist', or 'fn:package.module:function', your own function that "
        "returns split 'train' or 'test' as a finite tf.data.Dataset of unbatched (features, label) pairs, "
        "called once per split when the data is prepared (train it with model_fn)",
        check=Check(is_source, SOURCE_FORMS),
    )
    max_train_examples: int = setting(0, "keep only the first N training examples; 0 keeps all", check=at_least(0))
    max_test_examples: int = setting(0, "keep only the first N test examples; 0 keeps all", check=at_least(0))
    num_shards: int = setting(
        4,
        "TFRecord shards of the training split; a multiple of the worker count lets each worker read whole files",
        check=int_between(1, 1024),
    )
    class_names: str = setting(
        "", "comma-separated class names for IDX data; empty: 0, 1, ...", check=comma_list("class names")
    )
    prepare_workers: int = setting(
        MAX_PREPARE_WORKERS,
        "the most processes that write the TFRecord shards; fewer where the CPU this process may use (its cgroup's "
        "CPU quota, else its CPU affinity, else the machine's cores, rounded down), the shards of both splits or "
        f"one process per {MIN_EXAMPLES_PER_PREPARE_WORKER} examples allow fewer; "
        "1: in this process; the shards are the same bytes whatever the number",
        check=int_between(1, MAX_PREPARE_WORKERS),
        flag="--workers",
    )
    data_uri: str = setting(
        "",
        "where the TFRecord shards are written and read: s3://BUCKET/PREFIX (storage, s3_endpoint), "
        "gs://BUCKET/PREFIX or a path every pod mounts (a claim); a pipeline run writes under DATA_URI/<run key>; "
        "metadata.json (in the Dataset artifact) names the place, so KFP copies only that file into a pod and each "
        "training worker reads only its own shards from there; {namespace} is the run's namespace; empty: the shards "
        "are inside the Dataset artifact, which KFP copies whole into every pod that takes it",
        check=location("s3", "gs"),
    )
    tfds_data_dir: str = setting(
        "", "TFDS data_dir holding (or to receive) prepared TFDS datasets; empty: TFDS's own", check=text()
    )
    network_timeout: float = setting(
        5.0, "seconds to wait for a TFDS download host before failing", check=number_between(0.1, 600)
    )
    shuffle_buffer: int = setting(10_000, "examples in the training shuffle buffer", check=at_least(1))
    seed: int = setting(42, "seed of the weights, the shuffles and dropout", check=at_least(0))


@dataclasses.dataclass(frozen=True)
class ModelConfig(Checked):
    """Which model is trained."""

    model_fn: str = setting(
        "",
        "your own model: 'package.module:function' called with the features' tf.TensorSpec (one example, no batch "
        "dimension) that returns a compiled tf-keras model (its optimizer, loss and metrics are used; learning_rate "
        "is not); evaluation reports the metrics it was compiled with; multi_worker_mirrored only; empty: the "
        "built-in CNN for image classification",
        check=Check(lambda v: v == "" or is_function(v), f"empty or {FUNCTION_FORM}"),
    )
    mixed_precision: str = setting(
        "",
        "'mixed_float16': compute in float16 with float32 variables (the tf-keras global policy, set before the "
        "model is built, so a model_fn's layers follow it too); multi_worker_mirrored only, and only on workers "
        "with GPUs; empty: float32",
        check=one_of("", "mixed_float16"),
    )


@dataclasses.dataclass(frozen=True)
class OptimConfig(Checked):
    """How long and how fast to train."""

    epochs: int = setting(12, "passes over the training data", check=int_between(1, 100_000))
    batch_size: int = setting(
        64,
        "examples per replica per step (a replica is a worker, or each GPU of a worker with GPUs); the global "
        "batch is this times the replicas (workers x GPUs per worker)",
        check=int_between(1, 65_536),
    )
    learning_rate: float = setting(
        0.002,
        "peak Adam learning rate for one replica, decayed along a cosine to 5% over the run; multi_worker_mirrored "
        "scales it by sqrt(replicas) (its global batch grows with them), parameter_server does not (a step is one "
        "worker's batch)",
        check=number_between(1e-9, 10),
    )
    steps_per_epoch: int = setting(0, "steps per epoch; 0: training examples // global batch", check=at_least(0))
    steps_per_execution: int = setting(
        32,
        "training steps per call of the compiled step function (fewer Python "
        "round trips and per-call synchronisations between workers)",
        check=int_between(1, 10_000),
    )
    validate: bool = setting(
        False,
        "evaluate on the test split after every epoch (val_loss, val_accuracy in the history); "
        "multi_worker_mirrored only",
        check=FLAG,
    )


@dataclasses.dataclass(frozen=True)
class ClusterConfig(Checked):
    """The cluster's shape, how its members find each other, and how long they wait for each other."""

    strategy: str = setting(
        "multi_worker_mirrored",
        "multi_worker_mirrored (N identical workers, synchronous "
        "all-reduce) or parameter_server (a chief, parameter servers and workers)",
        check=one_of(*STRATEGIES),
    )
    num_workers: int = setting(
        2, "training workers; all of them must run at the same time", check=int_between(1, MAX_WORKERS)
    )
    num_ps: int = setting(1, "parameter servers (parameter_server strategy only)", check=int_between(1, MAX_WORKERS))
    cluster_mode: str = setting(
        "kubernetes",
        "'kubernetes': one headless Service per worker, found by DNS, and a parameter-server run's status on its "
        "ConfigMap; 'local': free loopback ports and that status in a file beside the model directory (kfp.local "
        "runs, trainer-launch)",
        check=one_of(*CLUSTER_MODES),
    )
    port: int = setting(
        2222,
        "the TF gRPC port each worker listens on in kubernetes mode; its supervisor's control "
        "channel uses the next one",
        check=int_between(1, 65534),
    )
    startup_timeout: float = setting(
        120.0,
        "seconds to wait for every peer to join before failing with the missing peers' names",
        check=number_between(1, 86_400),
    )
    unschedulable_timeout: float = setting(
        120.0,
        "kubernetes mode: fail the start-up early, naming the pod and the "
        "scheduler's reason, when a pod of the run has been unschedulable this "
        "many seconds",
        check=number_between(1, 86_400),
    )
    collective_timeout: float = setting(
        0.0,
        "seconds before one collective op fails; 0: none (a lost peer is still "
        "detected by heartbeats in about 10 s, and TF 2.21 leaks a thread per "
        "collective op when this is set)",
        check=number_between(0, 86_400),
    )
    chief_timeout: float = setting(
        60.0,
        "parameter_server: a parameter server or worker exits when the chief's "
        "heartbeat is older than this many seconds",
        check=number_between(1, 86_400),
    )
    max_restarts: int = setting(
        0,
        "restart the training process in place up to N times after a retryable failure (a lost or replaced "
        "peer, a killed process, a start-up timeout); all workers resume after the last epoch any of them finished",
        check=int_between(0, 100),
    )
    pack_bytes: int = setting(
        0, "all-reduce gradient packing: bytes per pack; 0: TensorFlow decides", check=at_least(0)
    )
    sync_batch_metrics: bool = setting(
        False,
        "multi_worker_mirrored: all-reduce the loss and metrics after every step, as tf-keras does by default (3 "
        "more collectives per metric and step, for per-batch logs only); off: every step's only collective is the "
        "gradients', per-batch logs are each worker's own, and the epoch's metrics are aggregated over all "
        "workers either way",
        check=FLAG,
    )


@dataclasses.dataclass(frozen=True)
class RuntimeConfig(Checked):
    """Where this process reads and writes, and which run it belongs to."""

    data_dir: str = setting(help="prepared dataset directory (from trainer-prepare)", check=non_empty(), flag="--data")
    model_dir: str = setting(
        help="where the chief writes saved_model/, model.keras and history.json", check=non_empty()
    )
    checkpoint_dir: str = setting(
        "",
        "where each worker keeps its checkpoint of the last finished epoch, in CHECKPOINT_DIR/<run key>/<task>, so "
        "that restarted and replaced workers of the same run resume (TensorFlow writes it: a path, a volume or "
        "gs://, not s3://); a volume or gs:// keeps them when every pod is lost; a later run with the same value "
        "starts from epoch 1, and other runs' leftovers untouched for 24 h are removed; empty: on "
        "checkpoint_claim's volume when set, else in the pod (a replaced pod gets a survivor's copy), "
        "MODEL_DIR.backup for the CLI",
        check=location("gs", what="a local or volume path (TensorFlow writes it and has no s3://)"),
    )
    checkpoint_claim: str = setting(
        "",
        "a ReadWriteMany PersistentVolumeClaim mounted at /mnt/checkpoints on every training pod of a pipeline "
        "compiled with --checkpoint-volume; checkpoints then outlive a pod; empty: no volume",
        check=dns_subdomain_or_empty("empty or a claim name"),
    )
    status_uri: str = setting(
        "",
        "parameter_server: where the chief keeps the status that parameter servers and workers poll: a path, "
        "s3://, gs:// or configmap:NAME, made the run's own (DIR/<run key>/NAME, ConfigMap NAME-<run key>); empty: "
        "a ConfigMap of the run in kubernetes mode, else MODEL_DIR.status/<run key>.json",
        check=Check(
            lambda v: location("s3", "gs").ok(v) or (isinstance(v, str) and v.startswith("configmap:") and len(v) > 10),
            "empty, a path, s3://BUCKET/KEY, gs://BUCKET/KEY or configmap:NAME",
        ),
    )
    run_id: str = setting(
        "",
        "the pipeline run's id: it names the run's Kubernetes Services, checkpoint and status locations and is "
        "recorded in the model's history for lineage; tasks with the same id resume each other's checkpoints; "
        "empty: a new id for each run of the launcher or the trainer",
        check=text(),
    )
    threads: int = setting(
        0,
        "TensorFlow intra-op threads; 0: TF_NUM_INTRAOP_THREADS when set, else the CPU this process may use (its "
        "cgroup's CPU quota, else its CPU affinity, else the machine's cores), rounded down",
        check=int_between(0, 1024),
    )
    tensorboard_dir: str = setting(
        "",
        "where the chief writes TensorBoard event files (loss, accuracy, learning rate, examples/s and, when "
        "validating, validation loss and accuracy, once per epoch) in a subdirectory named by run_id; a local "
        "path or a tf.io.gfile URI such as gs://bucket/tensorboard; empty: none",
        check=text(),
    )


@dataclasses.dataclass(frozen=True)
class PublishConfig(Checked):
    """The quality gate and where a model that passes it is published."""

    min_accuracy: float = setting(
        0.95,
        "the quality gate when gate is empty: a model below this test accuracy is not published",
        check=number_between(0, 1),
    )
    gate: str = setting(
        "",
        "the quality gate on any metric the evaluation reports, with its direction: 'METRIC>=VALUE' (accuracy, "
        "auc, pr-auc, ...) or 'METRIC<=VALUE' (loss, ...), METRIC named as KFP names a metric (letters, digits, '-' "
        "and '_'); the same metric and direction decide whether a model is better than the one published; empty: "
        "accuracy >= min_accuracy",
        check=Check(lambda v: v == "" or parse_gate(v) is not None, GATE_FORM),
    )
    publish_uri: str = setting(
        "",
        "where a model that passes the gate is published, in versioned directories with latest.json: a path (a "
        "volume), s3://BUCKET/PREFIX (KFP's SeaweedFS, MinIO, AWS) or gs://BUCKET/PREFIX; {namespace} is the run's "
        "namespace; empty: not published",
        check=location("s3", "gs"),
    )


@dataclasses.dataclass(frozen=True)
class StorageConfig(Checked):
    """Which object store the s3:// locations (data_uri, publish_uri, status_uri) are in, and with whose keys."""

    storage: str = setting(
        "",
        "'kfp': the pipeline's own object store (KFP 2.16+: SeaweedFS at http://seaweedfs.kubeflow:9000, the "
        "namespace's keys from the Secret mlpipeline-minio-artifact; compile with --storage kfp), where models go "
        "under s3://mlpipeline/private/{namespace}/; empty: the locations, s3_endpoint and credentials given",
        check=one_of("", "kfp"),
    )
    s3_endpoint: str = setting(
        "",
        "the S3 endpoint of s3:// locations (data_uri, publish_uri, status_uri), such as "
        "http://seaweedfs.kubeflow:9000; empty: the store storage names, else AWS S3 or $AWS_ENDPOINT_URL_S3",
        check=s3_endpoint(),
    )


@dataclasses.dataclass(frozen=True)
class ServingConfig(Checked):
    """The KServe InferenceService that serves the published model (docs/serving.md)."""

    serving_name: str = setting(
        "",
        "name of the KServe InferenceService that serves the published model, created or patched after "
        "publishing in the run's namespace; empty: no deployment",
        check=kserve_name_or_empty(),
    )
    serving_timeout: float = setting(
        900.0,
        "seconds to wait for the InferenceService to become Ready (the serving image is pulled and the model "
        "downloaded first) before failing with KServe's last reason",
        check=number_between(1, 86_400),
    )
    serving_runtime_version: str = setting(
        "2.20.0",
        "the TensorFlow Serving image tag the InferenceService runs (KServe's runtimeVersion); KServe's default "
        "2.6.2 cannot load what TensorFlow 2.21 exports (docs/serving.md)",
        check=image_tag(),
    )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training task needs, in the seven groups of the contract it uses.

    The quality gate is among them so that a task refuses, before its first epoch, a gate on a metric the model
    does not report (`trainer.training.setup.build`).
    """

    runtime: RuntimeConfig
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    cluster: ClusterConfig = ClusterConfig()
    storage: StorageConfig = StorageConfig()
    publish: PublishConfig = PublishConfig()

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The settings as plain JSON-ready dicts, group by group."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, dict[str, Any]]) -> TrainConfig:
        """The config from `to_dict`'s output (every value checked again)."""
        return cls(**{f.name: GROUPS[f.name](**values.get(f.name, {})) for f in dataclasses.fields(cls)})

    @classmethod
    def from_settings(cls, **values: Any) -> TrainConfig:
        """The config from settings given by name (`data_dir`, `model_dir`, `epochs`, ...); the rest keep defaults.

        Raises:
            UsageError: a name is not a setting of a training task, or `data_dir` or `model_dir` is missing.
        """
        groups = _by_group(values)
        missing = [n for n in ("data_dir", "model_dir") if n not in groups.get("runtime", {})]
        if missing:
            raise UsageError(f"a training task needs {' and '.join(missing)}")
        return cls(**{f.name: GROUPS[f.name](**groups.get(f.name, {})) for f in dataclasses.fields(cls)})

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with settings changed by name, whichever group they are in.

        Raises:
            UsageError: a name is not a setting of a training task.
        """
        groups = _by_group(changes)
        return dataclasses.replace(self, **{g: dataclasses.replace(getattr(self, g), **v) for g, v in groups.items()})


def _by_group(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Settings by name sorted into TrainConfig's groups; a setting of another group is refused."""
    own = {f.name: {s.name for s in dataclasses.fields(GROUPS[f.name])} for f in dataclasses.fields(TrainConfig)}
    groups: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        owner = next((group for group, names in own.items() if name in names), None)
        if owner is None:
            raise UsageError(
                f"{name!r} is not a setting of a training task; allowed: the settings of the groups "
                f"{', '.join(own)} (trainer/config/contract.py)"
            )
        groups.setdefault(owner, {})[name] = value
    return groups


GROUPS: dict[str, type] = {
    "runtime": RuntimeConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "cluster": ClusterConfig,
    "storage": StorageConfig,
    "publish": PublishConfig,
    "serving": ServingConfig,
}
