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


def create_pipeline(image: str = DEFAULT_IMAGE, cache_training: bool = False, pods: WorkerPodSettings = WorkerPodSettings()) -> Any:
    """Builds the pipeline with every step running in `image`.

    Args:
        image: the container image of every executor (built from the project's Dockerfile).
        cache_training: let KFP reuse the results of training and evaluation; off by default so a scheduled
            retrain really retrains. Data preparation is always cacheable.
        pods: resources, retries and timeout of the training worker pods.
    """
    ops = components.build(image)

    @dsl.pipeline(name=PIPELINE_NAME, description="Multi-worker TensorFlow training of a CNN on MNIST-format data: "
                  "prepare -> N workers (MultiWorkerMirroredStrategy) -> evaluate.")
    def mnist_pipeline(
        source: str = "tfds:mnist",
        num_workers: int = 2,
        epochs: int = 12,
        batch_size: int = 64,
        learning_rate: float = 0.001,
        max_train_examples: int = 0,
        max_test_examples: int = 0,
        num_shards: int = 4,
        cluster_mode: str = "kubernetes",
        port: int = 2222,
        startup_timeout: float = 600.0,
        collective_timeout: float = 0.0,
        checkpoint_dir: str = "",
    ):
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        cleanup = ops.delete_cluster(run_id=run_id, cluster_mode=cluster_mode)
        cleanup.set_display_name("delete cluster").set_caching_options(False)
        _with_namespace_env(cleanup)
        with dsl.ExitHandler(cleanup, name="train and evaluate"):
            prepared = ops.prepare_data(source=source, max_train_examples=max_train_examples,
                                        max_test_examples=max_test_examples, num_shards=num_shards)
            prepared.set_display_name("prepare data").set_caching_options(True)
            cluster = ops.create_cluster(num_workers=num_workers, run_id=run_id, cluster_mode=cluster_mode, port=port)
            cluster.set_display_name("create cluster").set_caching_options(False)
            _with_namespace_env(cluster)
            with dsl.ParallelFor(cluster.outputs["Output"]) as worker_index:
                worker = ops.train_worker(
                    dataset=prepared.outputs["dataset"], cluster=cluster.outputs["cluster"], worker_index=worker_index,
                    epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, startup_timeout=startup_timeout,
                    collective_timeout=collective_timeout, checkpoint_dir=checkpoint_dir, cluster_mode=cluster_mode,
                    run_id=run_id,
                )
                worker.set_display_name("train worker").set_caching_options(cache_training)
                _configure_worker(worker, pods)
            evaluation = ops.evaluate(dataset=prepared.outputs["dataset"], models=dsl.Collected(worker.outputs["model"]))
            evaluation.set_display_name("evaluate").set_caching_options(cache_training)

    return mnist_pipeline


mnist_pipeline = create_pipeline()


def compile_pipeline(output: str, image: str = DEFAULT_IMAGE, cache_training: bool = False) -> str:
    """Writes the pipeline YAML to `output` (through a temporary file) and returns the path."""
    if not output.endswith((".yaml", ".yml")):
        raise ValueError(f"--output {output!r} must end with .yaml or .yml")
    tmp = f"{output}.tmp-{os.getpid()}.yaml"
    try:
        compiler.Compiler().compile(create_pipeline(image, cache_training), package_path=tmp)
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


def run_local(num_workers: int, output_dir: str, epochs: int, source: str = "sample") -> "dict[str, Any]":
    """Runs the whole pipeline through kfp.local's SubprocessRunner; returns where its artifacts landed."""
    from kfp import local

    check_local_workers(num_workers)
    root = os.path.abspath(output_dir)
    os.makedirs(root, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root, raise_on_error=True)
    started = time.monotonic()
    mnist_pipeline(source=source, num_workers=num_workers, epochs=epochs, cluster_mode="local", startup_timeout=120.0)
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
    p.add_argument("--output", default="mnist_pipeline.yaml", help="with --compile: the YAML path")
    p.add_argument("--image", default=DEFAULT_IMAGE, help=f"with --compile: every executor's image (default {DEFAULT_IMAGE})")
    p.add_argument("--cache-training", action="store_true", help="with --compile: allow caching of training and evaluation")
    p.add_argument("--num-workers", type=int, default=2, help=f"with --local: workers (1 to {LOCAL_MAX_WORKERS})")
    p.add_argument("--epochs", type=int, default=12, help="with --local: training epochs")
    p.add_argument("--source", default="sample", help="with --local: data source (default: the shipped sample)")
    p.add_argument("--output-dir", default="out/pipeline", help="with --local: the local pipeline root")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.compile:
        started = time.monotonic()
        try:
            compile_pipeline(args.output, args.image, args.cache_training)
        except (ValueError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"wrote {args.output} (image {args.image}) in {time.monotonic() - started:.2f}s")
        return 0
    try:
        check_local_workers(args.num_workers)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    result = run_local(args.num_workers, args.output_dir, args.epochs, args.source)
    artifacts = find_artifacts(result["pipeline_root"])
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"\npipeline finished in {result['seconds']}s")
    print(f"test accuracy: {artifacts['accuracy']:.4f}")
    for name in ("run", "model", "report"):
        print(f"{name}: {artifacts.get(name, 'not found')}")
    print(json.dumps(artifacts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
