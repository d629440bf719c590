"""The MNIST pipeline: prepare data -> N training workers sharing a generated cluster -> evaluate.

    python pipelines/mnist.py --compile --output mnist_pipeline.yaml --image REGISTRY/kfp-tf-multiworker:0.1.0
    python pipelines/mnist.py --local --num-workers 2
    kfp dsl compile --py pipelines/mnist.py --output mnist_pipeline.yaml
"""


import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kfp import compiler, dsl, kubernetes

import components
from pipelines import deploy
from trainer import __version__

log = logging.getLogger("pipelines.mnist")

DEFAULT_IMAGE = f"kfp-tf-multiworker:{__version__}"
PIPELINE_NAME = "mnist-multiworker"
LOCAL_MAX_WORKERS = 2


@dataclasses.dataclass(frozen=True)
class WorkerPodSettings:
    """Compile-time settings of the training worker pods on a cluster (kfp.local ignores them)."""

    cpu_request: str = "1"
    cpu_limit: str = "2"
    memory_request: str = "2Gi"
    memory_limit: str = "4Gi"
    gpus: int = 0
    retries: int = 2
    timeout_seconds: int = 6 * 3600

    def __post_init__(self) -> None:
        if self.gpus < 0 or self.retries < 0 or self.timeout_seconds < 1:
            raise ValueError(f"worker pod settings {self} are not allowed; allowed: gpus >= 0, retries >= 0, timeout >= 1 s")


def _with_namespace_env(task: Any) -> Any:
    return kubernetes.use_field_path_as_env(task, env_name="POD_NAMESPACE", field_path="metadata.namespace")


def _configure_worker(task: Any, pods: WorkerPodSettings) -> None:
    _with_namespace_env(task)
    kubernetes.use_field_path_as_env(task, env_name="POD_NAME", field_path="metadata.name")
    kubernetes.add_pod_annotation(task, annotation_key="sidecar.istio.io/inject", annotation_value="false")
    task.set_cpu_request(pods.cpu_request).set_cpu_limit(pods.cpu_limit)
    task.set_memory_request(pods.memory_request).set_memory_limit(pods.memory_limit)
    if pods.gpus:
        task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(pods.gpus)
    task.set_retry(num_retries=pods.retries, backoff_duration="30s", backoff_factor=2.0)
    kubernetes.set_timeout(task, pods.timeout_seconds)


STRATEGIES = ("multi_worker_mirrored", "parameter_server")


def _evaluate_and_publish(ops: Any, prepared: Any, models: Any, cache_training: bool, run_id: str, p: "dict[str, Any]") -> None:
    """evaluate, then the quality gate and the publish step: the same for both strategies."""
    evaluation = ops.evaluate(dataset=prepared.outputs["dataset"], models=models, min_accuracy=p["min_accuracy"])
    evaluation.set_display_name("evaluate").set_caching_options(cache_training)
    with dsl.If(evaluation.outputs["Output"] >= p["min_accuracy"], name="quality gate"):
        with dsl.If(p["publish_uri"] != "", name="publish location set"):
            published = ops.publish_model(
                model=evaluation.outputs["chief_model"], metrics=evaluation.outputs["metrics"], publish_uri=p["publish_uri"],
                run_id=run_id, source=p["source"], num_workers=p["num_workers"], epochs=p["epochs"],
                batch_size=p["batch_size"], learning_rate=p["learning_rate"])
            published.set_display_name("publish model").set_caching_options(False)


def _prepare_and_cluster(ops: Any, run_id: str, p: "dict[str, Any]", num_ps: Any = 0) -> "tuple[Any, Any]":
    prepared = ops.prepare_data(source=p["source"], max_train_examples=p["max_train_examples"],
                                max_test_examples=p["max_test_examples"], num_shards=p["num_shards"])
    prepared.set_display_name("prepare data").set_caching_options(True)
    cluster = ops.create_cluster(num_workers=p["num_workers"], run_id=run_id, cluster_mode=p["cluster_mode"], port=p["port"], num_ps=num_ps)
    cluster.set_display_name("create cluster").set_caching_options(False)
    _with_namespace_env(cluster)
    return prepared, cluster


def _cleanup(ops: Any, run_id: str, cluster_mode: Any) -> Any:
    cleanup = ops.delete_cluster(run_id=run_id, cluster_mode=cluster_mode)
    cleanup.set_display_name("delete cluster").set_caching_options(False)
    _with_namespace_env(cleanup)
    return cleanup


def create_pipeline(image: str = DEFAULT_IMAGE, cache_training: bool = False, pods: WorkerPodSettings = WorkerPodSettings(),
                    strategy: str = "multi_worker_mirrored") -> Any:
    """Builds the pipeline with every step running in `image`.

    Args:
        image: the container image of every executor (built from the project's Dockerfile).
        cache_training: let KFP reuse the results of training and evaluation; off by default so a scheduled
            retrain really retrains. Data preparation is always cacheable.
        pods: resources, retries and timeout of the training pods.
        strategy: 'multi_worker_mirrored' (N identical workers, synchronous all-reduce) or 'parameter_server'
            (a chief op, a ParallelFor of parameter-server and worker ops).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not allowed; allowed: {', '.join(STRATEGIES)}")
    ops = components.build(image)
    if strategy == "parameter_server":
        return _parameter_server_pipeline(ops, cache_training, pods)

    @dsl.pipeline(name=PIPELINE_NAME, description="Multi-worker TensorFlow training of a CNN on MNIST-format data: "
                  "prepare -> N workers (MultiWorkerMirroredStrategy) -> evaluate.")
    def mnist_pipeline(
        source: str = "tfds:mnist",
        num_workers: int = 2,
        epochs: int = 12,
        batch_size: int = 64,
        learning_rate: float = 0.002,
        max_train_examples: int = 0,
        max_test_examples: int = 0,
        num_shards: int = 4,
        cluster_mode: str = "kubernetes",
        port: int = 2222,
        startup_timeout: float = 600.0,
        collective_timeout: float = 0.0,
        checkpoint_dir: str = "",
        min_accuracy: float = 0.95,
        publish_uri: str = "",
    ):
        p = dict(locals())
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        with dsl.ExitHandler(_cleanup(ops, run_id, cluster_mode), name="train and evaluate"):
            prepared, cluster = _prepare_and_cluster(ops, run_id, p)
            with dsl.ParallelFor(cluster.outputs["Output"]) as worker_index:
                worker = ops.train_worker(
                    dataset=prepared.outputs["dataset"], cluster=cluster.outputs["cluster"], worker_index=worker_index,
                    epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, startup_timeout=startup_timeout,
                    collective_timeout=collective_timeout, checkpoint_dir=checkpoint_dir, cluster_mode=cluster_mode,
                    run_id=run_id,
                )
                worker.set_display_name("train worker").set_caching_options(cache_training)
                _configure_worker(worker, pods)
            _evaluate_and_publish(ops, prepared, dsl.Collected(worker.outputs["model"]), cache_training, run_id, p)

    return mnist_pipeline


def _parameter_server_pipeline(ops: Any, cache_training: bool, pods: WorkerPodSettings) -> Any:
    @dsl.pipeline(name=PIPELINE_NAME, description="Parameter-server TensorFlow training of a CNN on MNIST-format data: "
                  "prepare -> chief + parameter servers + workers (ParameterServerStrategy) -> evaluate.")
    def mnist_pipeline(
        status_uri: str,
        source: str = "tfds:mnist",
        num_workers: int = 2,
        num_ps: int = 1,
        epochs: int = 12,
        batch_size: int = 64,
        learning_rate: float = 0.002,
        max_train_examples: int = 0,
        max_test_examples: int = 0,
        num_shards: int = 4,
        cluster_mode: str = "kubernetes",
        port: int = 2222,
        startup_timeout: float = 600.0,
        chief_timeout: float = 120.0,
        min_accuracy: float = 0.95,
        publish_uri: str = "",
    ):
        p = dict(locals())
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        with dsl.ExitHandler(_cleanup(ops, run_id, cluster_mode), name="train and evaluate"):
            prepared, cluster = _prepare_and_cluster(ops, run_id, p, num_ps=num_ps)
            with dsl.ParallelFor([0], name="chief") as _:
                chief = ops.train_chief(
                    dataset=prepared.outputs["dataset"], cluster=cluster.outputs["cluster"], status_uri=status_uri, epochs=epochs,
                    batch_size=batch_size, learning_rate=learning_rate, startup_timeout=startup_timeout, cluster_mode=cluster_mode,
                    run_id=run_id)
                chief.set_display_name("train chief").set_caching_options(cache_training)
                _configure_worker(chief, pods)
            with dsl.ParallelFor(cluster.outputs["Output"], name="parameter servers and workers") as task:
                server = ops.train_server(
                    dataset=prepared.outputs["dataset"], cluster=cluster.outputs["cluster"], task=task, status_uri=status_uri,
                    startup_timeout=startup_timeout, chief_timeout=chief_timeout, cluster_mode=cluster_mode, run_id=run_id)
                server.set_display_name("ps or worker").set_caching_options(False)
                _configure_worker(server, pods)
            _evaluate_and_publish(ops, prepared, dsl.Collected(chief.outputs["model"]), cache_training, run_id, p)

    return mnist_pipeline


mnist_pipeline = create_pipeline()


def compile_pipeline(output: str, image: str = DEFAULT_IMAGE, cache_training: bool = False, strategy: str = "multi_worker_mirrored") -> str:
    """Writes the pipeline YAML to `output` (through a temporary file) and returns the path."""
    if not output.endswith((".yaml", ".yml")):
        raise ValueError(f"--output {output!r} must end with .yaml or .yml")
    tmp = f"{output}.tmp-{os.getpid()}.yaml"
    try:
        compiler.Compiler().compile(create_pipeline(image, cache_training, strategy=strategy), package_path=tmp)
        os.replace(tmp, output)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return output


def check_local_workers(num_workers: int) -> None:
    """Refuses worker counts that kfp.local cannot run at once (it runs at most 2 loop iterations concurrently)."""
    if not 1 <= num_workers <= LOCAL_MAX_WORKERS:
        raise ValueError(
            f"--num-workers {num_workers} is not allowed with --local; allowed: 1 to {LOCAL_MAX_WORKERS}. kfp.local "
            "runs at most 2 ParallelFor iterations at once and every MultiWorkerMirroredStrategy worker must run at "
            "the same time, so more workers would wait for each other forever; use trainer-launch or a cluster"
        )


def run_local(num_workers: int, output_dir: str, epochs: int, source: str = "sample", min_accuracy: float = 0.95,
              publish_uri: str = "") -> "dict[str, Any]":
    """Runs the whole pipeline through kfp.local's SubprocessRunner; returns where its artifacts landed."""
    from kfp import local

    check_local_workers(num_workers)
    root = os.path.abspath(output_dir)
    os.makedirs(root, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    started = time.monotonic()
    mnist_pipeline(source=source, num_workers=num_workers, epochs=epochs, cluster_mode="local", startup_timeout=120.0,
                   min_accuracy=min_accuracy, publish_uri=os.path.abspath(publish_uri) if publish_uri else "")
    return {"pipeline_root": root, "seconds": round(time.monotonic() - started, 1)}


def find_artifacts(root: str) -> dict[str, str]:
    """Where the newest local run under `root` put the chief's model and the report."""
    runs = sorted(Path(root).glob(f"{PIPELINE_NAME}-*"), key=lambda p: p.stat().st_mtime)
    if not runs:
        return {}
    run_dir = runs[-1]
    found = {"run": str(run_dir)}
    models = [p.parent for p in run_dir.glob("*/train-worker/model/saved_model")]
    if models:
        found["model"] = str(models[0])
    decision = next(run_dir.glob("publish-model/decision"), None)
    if decision is not None:
        found["publish"] = decision.read_text().splitlines()[2]
    if (run_dir / "evaluate" / "report").is_file():
        found["report"] = str(run_dir / "evaluate" / "report")
    outputs = run_dir / "evaluate" / "executor_output.json"
    if outputs.is_file():
        found["accuracy"] = json.loads(outputs.read_text())["parameterValues"]["Output"]
    return found


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipelines/mnist.py", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile", action="store_true", help="write the pipeline YAML")
    mode.add_argument("--local", action="store_true", help="run the whole pipeline here with kfp.local")
    mode.add_argument("--upload", action="store_true", help="upload to a KFP server (a new version if the name exists)")
    mode.add_argument("--run", action="store_true", help="upload, then start one run in --experiment")
    mode.add_argument("--schedule", metavar="CRON", help="upload, then create a recurring run; KFP cron: 6 fields, seconds first")
    mode.add_argument("--every", metavar="DURATION", help="upload, then create a recurring run every DURATION (e.g. 24h, 30m)")
    p.add_argument("--output", default="mnist_pipeline.yaml", help="with --compile: the YAML path")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"every executor's image (default {DEFAULT_IMAGE})")
    p.add_argument("--cache-training", action="store_true", help="allow caching of training and evaluation")
    p.add_argument("--strategy", default="multi_worker_mirrored", choices=STRATEGIES,
                   help="multi_worker_mirrored (default) or parameter_server (chief, ps and worker ops)")
    local = p.add_argument_group("--local")
    local.add_argument("--num-workers", type=int, default=2, help=f"workers (1 to {LOCAL_MAX_WORKERS})")
    local.add_argument("--epochs", type=int, default=12, help="training epochs")
    local.add_argument("--source", default="sample", help="data source (default: the shipped sample)")
    local.add_argument("--output-dir", default="out/pipeline", help="the local pipeline root")
    local.add_argument("--min-accuracy", type=float, default=0.95, help="the quality gate before publishing")
    local.add_argument("--publish-uri", default="", help="where a model that passes the gate is published")
    server = p.add_argument_group("--upload, --run, --schedule, --every")
    server.add_argument("--host", default=os.environ.get("KF_PIPELINES_ENDPOINT"), help="KFP API endpoint (default: $KF_PIPELINES_ENDPOINT)")
    server.add_argument("--token-file", default=None,
                        help="file holding a bearer token (default: $KF_PIPELINES_TOKEN, else "
                             "/var/run/secrets/kubeflow/pipelines/token when present)")
    server.add_argument("--namespace", default=None, help="Kubeflow profile namespace (multi-user Kubeflow)")
    server.add_argument("--pipeline-name", default=PIPELINE_NAME)
    server.add_argument("--experiment", default=PIPELINE_NAME, help="experiment for runs (created if missing)")
    server.add_argument("--run-name", default=None, help="name of the run or recurring run")
    server.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="pipeline parameter, checked against the pipeline")
    server.add_argument("--max-concurrency", type=int, default=1, help="recurring runs: at most this many at once")
    server.add_argument("--no-catchup", action="store_true", help="recurring runs: skip missed intervals instead of backfilling")
    server.add_argument("--start", default=None, help="recurring runs: RFC 3339 start time, e.g. 2027-01-01T00:00:00Z")
    server.add_argument("--end", default=None, help="recurring runs: RFC 3339 end time")
    return p


TOKEN_FILE = "/var/run/secrets/kubeflow/pipelines/token"


def _token(args: argparse.Namespace) -> "str | None":
    if args.token_file:
        try:
            with open(args.token_file) as f:
                return f.read().strip()
        except OSError as err:
            raise deploy.DeployError(f"--token-file {args.token_file!r} cannot be read: {err.strerror}") from None
    if os.environ.get("KF_PIPELINES_TOKEN"):
        return os.environ["KF_PIPELINES_TOKEN"]
    if os.path.isfile(TOKEN_FILE):
        with open(TOKEN_FILE) as f:
            return f.read().strip()
    return None


def _rfc3339(name: str, value: "str | None") -> "str | None":
    from datetime import datetime

    if value is None:
        return None
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise deploy.DeployError(f"{name} {value!r} is not an RFC 3339 time; allowed: e.g. 2027-01-01T02:00:00Z") from None
    return value


def to_server(args: argparse.Namespace) -> int:
    """--upload / --run / --schedule / --every: everything is checked before the first request."""
    import tempfile

    try:
        if not args.host:
            raise deploy.DeployError("no KFP host: pass --host URL or set KF_PIPELINES_ENDPOINT")
        cron = deploy.check_cron(args.schedule) if args.schedule else None
        interval = deploy.parse_duration(args.every) if args.every else None
        if args.max_concurrency < 1:
            raise deploy.DeployError(f"--max-concurrency {args.max_concurrency} is not allowed; allowed: 1 or more")
        start, end = _rfc3339("--start", args.start), _rfc3339("--end", args.end)
        token = _token(args)
        with tempfile.TemporaryDirectory() as tmp:
            package = compile_pipeline(os.path.join(tmp, "pipeline.yaml"), args.image, args.cache_training, args.strategy)
            params = deploy.typed_params(args.param, deploy.pipeline_parameters(package))
            try:
                client = deploy.make_client(args.host, token, args.namespace)
                pipeline_id, version_id = deploy.upload(client, args.host, package, args.pipeline_name, __version__)
            except deploy.DeployError as err:
                print(f"error: {err}", file=sys.stderr)
                return 1
    except deploy.DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    host = args.host.rstrip("/")
    print(f"pipeline {pipeline_id} version {version_id}")
    print(f"{host}/#/pipelines/details/{pipeline_id}/version/{version_id}")
    if args.upload:
        return 0
    name = args.run_name or f"{args.pipeline_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    try:
        experiment = deploy.experiment_id(client, host, args.experiment, args.namespace)
        if args.run:
            run_id = deploy.start_run(client, host, experiment, name, pipeline_id, version_id, params)
            print(f"run {run_id}: {host}/#/runs/details/{run_id}")
        else:
            recurring = deploy.schedule(client, host, experiment, name, pipeline_id, version_id, params, cron=cron,
                                        interval_seconds=interval, max_concurrency=args.max_concurrency,
                                        no_catchup=args.no_catchup, start_time=start, end_time=end)
            print(f"recurring run {recurring}: {host}/#/recurringruns/details/{recurring}")
    except deploy.DeployError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.upload or args.run or args.schedule or args.every:
        return to_server(args)
    if args.compile:
        started = time.monotonic()
        try:
            compile_pipeline(args.output, args.image, args.cache_training, args.strategy)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {args.output} (image {args.image}) in {time.monotonic() - started:.2f}s")
        return 0
    try:
        if args.strategy == "parameter_server":
            raise ValueError("--strategy parameter_server is not allowed with --local: kfp.local runs at most 2 ops at once, "
                             "and a chief, a parameter server and a worker must all run together; use trainer-launch --ps N")
        check_local_workers(args.num_workers)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = run_local(args.num_workers, args.output_dir, args.epochs, args.source, args.min_accuracy, args.publish_uri)
    artifacts = find_artifacts(result["pipeline_root"])
    lines = [f"pipeline finished in {result['seconds']}s", f"test accuracy: {artifacts['accuracy']:.4f}"]
    for name in ("run", "model", "report", "publish"):
        lines.append(f"{name}: {artifacts.get(name, 'not found' if name != 'publish' else 'no publish step (gate failed or no --publish-uri)')}")
    lines.append(json.dumps(artifacts))
    # sys.stdout.write, not print: kfp.local leaves builtins.print patched to indent every line
    sys.stdout.write("\n" + "\n".join(lines) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
