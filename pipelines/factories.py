"""The pipelines, one pure factory per strategy: an image and pod settings in, a KFP pipeline out.

With GPUs (`PodSettings.gpus`) the training tasks ask for them and run the GPU image; the other steps keep `image`.

    prepare data -> create cluster -> training tasks (ParallelFor) -> evaluate + serving check -> quality gate
        -> publish -> deploy (a KServe InferenceService, when serving_name is set)

Every parameter is a setting of the contract (`trainer.config.contract`): its default and description come from there.
There is no exit handler: each training task creates its own Kubernetes Service when it joins and deletes it when
its step ends, and the run's Argo Workflow owns every Service (docs/cluster.md says why: KFP runs no cleanup hook
after a failed ParallelFor except around it in a dsl.ExitHandler, which forbids pipeline outputs, and
kubeflow/pipelines#12390 reports a ParallelFor inside an ExitHandler failing on KFP 2.14).
"""

from typing import Any, NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Metrics, Model

import components
from components.signatures import declare
from pipelines.pods import PodSettings, step, training_pod, with_namespace
from pipelines.storage import StorageSettings, with_checkpoint_volume, with_storage_secret

DEFAULT_PODS = PodSettings()
DEFAULT_STORAGE = StorageSettings()
NAMES = {"multi_worker_mirrored": "mnist-multiworker", "parameter_server": "mnist-parameter-server"}


class Outputs(NamedTuple):
    """What a run returns: the test accuracy, the serving check's verdict, the chief's model, metrics and report."""

    accuracy: float
    serving_check: str
    model: Model
    metrics: Metrics
    report: HTML


class Serving(NamedTuple):
    """The pipeline parameters of the deploy step."""

    name: Any
    timeout: Any
    runtime_version: Any


class Store(NamedTuple):
    """The pipeline parameters that say which object store s3:// locations are in."""

    storage: Any
    s3_endpoint: Any


def _ops(image: str, pods: PodSettings) -> tuple[Any, Any]:
    """The components in `image`, and the training components in the training image (the GPU one with GPUs)."""
    ops = components.build(image)
    training_image = pods.training_image(image)
    return ops, ops if training_image == image else components.build(training_image)


class Data(NamedTuple):
    """The pipeline parameters of the prepare step."""

    source: Any
    max_train_examples: Any
    max_test_examples: Any
    num_shards: Any
    data_uri: Any


def _prepare(ops: Any, settings: StorageSettings, data: Data, store: Store) -> Any:
    prepared = ops.prepare_data(
        **data._asdict(), run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, storage=store.storage, s3_endpoint=store.s3_endpoint
    )
    return with_storage_secret(with_namespace(step(prepared, "prepare data", cache=settings.cache_data)), settings)


def _evaluate_and_publish(
    ops: Any,
    prepared: Any,
    models: Any,
    gate: tuple[Any, Any],
    publish_uri: Any,
    store: Store,
    settings: StorageSettings,
    serving: Serving,
) -> Outputs:
    min_accuracy, custom_gate = gate
    evaluation = ops.evaluate(
        dataset=prepared.outputs["dataset"], models=models, min_accuracy=min_accuracy, gate=custom_gate
    )
    with_storage_secret(step(evaluation, "evaluate and check serving"), settings)
    # evaluate decides (the gate and the serving check passed), the pipeline routes: one condition
    # on evaluate's Output, because kfp.local resolves no other named output in a condition.
    with dsl.If(evaluation.outputs["Output"] == "publish", name="quality gate and serving check"):
        with dsl.If(publish_uri != "", name="publish location set"):
            published = ops.publish_model(
                model=evaluation.outputs["chief_model"],
                metrics=evaluation.outputs["metrics"],
                publish_uri=publish_uri,
                storage=store.storage,
                s3_endpoint=store.s3_endpoint,
                gate=custom_gate,
            )
            with_storage_secret(with_namespace(step(published, "publish model")), settings)
            with dsl.If(serving.name != "", name="serving name set"):
                deployed = ops.deploy_model(
                    decision=published.outputs["decision"],
                    publish_uri=publish_uri,
                    serving_name=serving.name,
                    serving_timeout=serving.timeout,
                    serving_runtime_version=serving.runtime_version,
                    storage=store.storage,
                    s3_endpoint=store.s3_endpoint,
                )
                with_storage_secret(with_namespace(step(deployed, "deploy model")), settings)
    return Outputs(
        accuracy=evaluation.outputs["accuracy"],
        serving_check=evaluation.outputs["serving_check"],
        model=evaluation.outputs["chief_model"],
        metrics=evaluation.outputs["metrics"],
        report=evaluation.outputs["report"],
    )


def mirrored_pipeline(image: str, pods: PodSettings = DEFAULT_PODS, settings: StorageSettings = DEFAULT_STORAGE) -> Any:
    """The MultiWorkerMirroredStrategy pipeline: N identical workers in a ParallelFor, synchronous all-reduce."""
    ops, training = _ops(image, pods)

    def pipeline(
        source: str,
        num_workers: int,
        epochs: int,
        batch_size: int,
        learning_rate: float,
        max_train_examples: int,
        max_test_examples: int,
        num_shards: int,
        data_uri: str,
        cluster_mode: str,
        port: int,
        startup_timeout: float,
        unschedulable_timeout: float,
        collective_timeout: float,
        max_restarts: int,
        checkpoint_dir: str,
        checkpoint_claim: str,
        tensorboard_dir: str,
        model_fn: str,
        mixed_precision: str,
        min_accuracy: float,
        gate: str,
        publish_uri: str,
        storage: str,
        s3_endpoint: str,
        serving_name: str,
        serving_timeout: float,
        serving_runtime_version: str,
    ) -> Outputs:
        """Multi-worker TensorFlow training of a CNN on MNIST-format data, or of your own model (MultiWorkerMirrored).

        Your own tf-keras model: model_fn; your own data: source fn:package.module:function.
        prepare data -> create cluster -> N training workers -> evaluate + serving check -> quality gate -> publish
        -> deploy to KServe.
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        store = Store(storage, s3_endpoint)
        data = Data(source, max_train_examples, max_test_examples, num_shards, data_uri)
        prepared = _prepare(ops, settings, data, store)
        cluster = ops.create_cluster(run_id=run_id, num_workers=num_workers, cluster_mode=cluster_mode, port=port)
        with_namespace(step(cluster, "create cluster"))
        with dsl.ParallelFor(cluster.outputs["Output"], name="workers") as worker_index:
            worker = training.train_worker(
                dataset=prepared.outputs["dataset"],
                cluster=cluster.outputs["cluster"],
                worker_index=worker_index,
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
                checkpoint_claim=checkpoint_claim,
                tensorboard_dir=tensorboard_dir,
                cluster_mode=cluster_mode,
                gate=gate,
                mixed_precision=mixed_precision,
            )
            with_storage_secret(training_pod(step(worker, "train worker"), pods), settings)
            with_checkpoint_volume(worker, checkpoint_claim, settings)
        serving = Serving(serving_name, serving_timeout, serving_runtime_version)
        models = dsl.Collected(worker.outputs["model"])
        gates = (min_accuracy, gate)
        return _evaluate_and_publish(ops, prepared, models, gates, publish_uri, store, settings, serving)

    return dsl.pipeline(name=NAMES["multi_worker_mirrored"])(declare(pipeline, settings.overrides(streams_data=True)))


def parameter_server_pipeline(
    image: str, pods: PodSettings = DEFAULT_PODS, settings: StorageSettings = DEFAULT_STORAGE
) -> Any:
    """The ParameterServerStrategy pipeline: a chief task beside a ParallelFor of parameter servers and workers."""
    ops, training = _ops(image, pods)

    def pipeline(
        source: str,
        num_workers: int,
        num_ps: int,
        epochs: int,
        batch_size: int,
        learning_rate: float,
        max_train_examples: int,
        max_test_examples: int,
        num_shards: int,
        data_uri: str,
        cluster_mode: str,
        port: int,
        startup_timeout: float,
        unschedulable_timeout: float,
        chief_timeout: float,
        status_uri: str,
        tensorboard_dir: str,
        min_accuracy: float,
        gate: str,
        publish_uri: str,
        storage: str,
        s3_endpoint: str,
        serving_name: str,
        serving_timeout: float,
        serving_runtime_version: str,
    ) -> Outputs:
        """Parameter-server TensorFlow training of a CNN on MNIST-format data (ParameterServerStrategy).

        prepare data -> create cluster -> a chief + parameter servers + workers -> evaluate + serving check -> quality
        gate -> publish -> deploy to KServe.
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        store = Store(storage, s3_endpoint)
        data = Data(source, max_train_examples, max_test_examples, num_shards, data_uri)
        prepared = _prepare(ops, settings, data, store)
        cluster = ops.create_ps_cluster(
            run_id=run_id, num_workers=num_workers, num_ps=num_ps, cluster_mode=cluster_mode, port=port
        )
        with_namespace(step(cluster, "create cluster"))
        # The chief runs in a one-item loop so that evaluate receives its model as the list the mirrored variant's
        # ParallelFor produces (dsl.Collected works only on loop outputs).
        every_task = {
            "dataset": prepared.outputs["dataset"],
            "cluster": cluster.outputs["cluster"],
            "run_id": run_id,
            "status_uri": status_uri,
            "storage": storage,
            "s3_endpoint": s3_endpoint,
            "startup_timeout": startup_timeout,
            "unschedulable_timeout": unschedulable_timeout,
            "cluster_mode": cluster_mode,
        }
        with dsl.ParallelFor([0], name="chief"):
            chief = training.train_chief(
                epochs=epochs,
                batch_size=batch_size,
                learning_rate=learning_rate,
                tensorboard_dir=tensorboard_dir,
                **every_task,
            )
            with_storage_secret(training_pod(step(chief, "train chief"), pods), settings)
        with dsl.ParallelFor(cluster.outputs["Output"], name="parameter servers and workers") as task:
            server = training.train_server(task=task, chief_timeout=chief_timeout, **every_task)
            with_storage_secret(training_pod(step(server, "ps or worker"), pods), settings)
        serving = Serving(serving_name, serving_timeout, serving_runtime_version)
        models = dsl.Collected(chief.outputs["model"])
        gates = (min_accuracy, gate)
        return _evaluate_and_publish(ops, prepared, models, gates, publish_uri, store, settings, serving)

    return dsl.pipeline(name=NAMES["parameter_server"])(declare(pipeline, settings.overrides()))


FACTORIES = {"multi_worker_mirrored": mirrored_pipeline, "parameter_server": parameter_server_pipeline}


def create_pipeline(
    image: str,
    strategy: str = "multi_worker_mirrored",
    pods: PodSettings = DEFAULT_PODS,
    storage: StorageSettings = DEFAULT_STORAGE,
) -> Any:
    """The pipeline of `strategy` with every step running in `image` (the training steps in the GPU image with GPUs)."""
    return FACTORIES[strategy](image, pods, storage)
