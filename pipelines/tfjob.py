"""From a TFJob manifest to a pipeline: compile it for a cluster, or run every task of it here as local processes.

    python pipelines/tfjob.py tfjob.yaml --compile --image REGISTRY/kfp-tf-multiworker:0.1.0 --output job.yaml
    python pipelines/tfjob.py tfjob.yaml --local --mount /app=. --publish-uri out/published

Every field the manifest has that cannot be carried over is refused with one line naming it (exit 2); fields kept
with a different behaviour are printed as `warning:` lines. docs/migrate-from-tfjob.md has the table.
"""

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.command.tfjob_spec import JobSpec, read_manifest
from trainer.core.entry import run_cli
from trainer.core.errors import UsageError
from trainer.core.files import write_text

PYTHON = ("python", "python3")


def load(path: str) -> JobSpec:
    """Reads and checks the manifest at `path` (YAML, one document)."""
    import yaml

    try:
        with open(path) as f:
            documents = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as err:
        raise UsageError(f"manifest {path!r} cannot be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UsageError(f"manifest {path!r} is not valid YAML: {str(err).splitlines()[0]}") from None
    if len(documents) != 1:
        raise UsageError(f"manifest {path!r} holds {len(documents)} documents; allowed: exactly one TFJob")
    return read_manifest(documents[0])


def _mounts(pairs: list[str]) -> dict[str, str]:
    mounts = {}
    for pair in pairs:
        path, sep, host = pair.partition("=")
        if not sep or not host or not path.startswith("/"):
            raise UsageError(f"--mount {pair!r} is not allowed; allowed: /path/in/the/container=HOST_DIR")
        mounts[path.rstrip("/") or "/"] = os.path.abspath(host)
    return mounts


def _rewrite(text: str, mounts: dict[str, str]) -> str:
    for path in sorted(mounts, key=len, reverse=True):
        if text == path or text.startswith(path + "/"):
            return mounts[path] + text[len(path) :]
        for prefix in ("=", ":"):
            marker = prefix + path
            at = text.find(marker)
            if at >= 0 and (len(text) == at + len(marker) or text[at + len(marker)] == "/"):
                return text[: at + 1] + mounts[path] + text[at + len(marker) :]
    return text


def local_paths(job: JobSpec, mounts: dict[str, str], volumes: str) -> dict[str, str]:
    """Container paths and the host directories a local run puts there.

    `mounts` first, then each claim's mount path at a directory of its own under `volumes`, which every task shares
    (as a ReadWriteMany claim would).
    """
    paths = dict(mounts)
    for replica in job.replicas:
        for mount in replica.mounts:
            paths.setdefault(mount.path.rstrip("/"), os.path.join(volumes, mount.claim))
    return paths


def for_this_machine(job: JobSpec, paths: dict[str, str]) -> JobSpec:
    """The job as `--local` runs it.

    Container paths are rewritten to host paths (`local_paths`), `python` is this interpreter, and no claims remain.
    """
    replicas = []
    for replica in job.replicas:
        for mount in replica.mounts:
            os.makedirs(paths[mount.path.rstrip("/")], exist_ok=True)
        command = [_rewrite(part, paths) for part in replica.command]
        if command and command[0] in PYTHON:
            command[0] = sys.executable
        replicas.append(
            dataclasses.replace(
                replica,
                command=tuple(command),
                args=tuple(_rewrite(a, paths) for a in replica.args),
                env=tuple((k, _rewrite(v, paths)) for k, v in replica.env),
                working_dir=_rewrite(replica.working_dir, paths) if replica.working_dir else "",
                mounts=(),
            )
        )
    return dataclasses.replace(job, replicas=tuple(replicas))


def _warn(job: JobSpec) -> None:
    for line in job.warnings:
        print(f"warning: {line}", file=sys.stderr)


def compile_job(args: argparse.Namespace) -> None:
    """Writes the pipeline YAML of the manifest, with the storage and pod settings of the flags."""
    from kfp import compiler

    from pipelines.cli import check_image, pod_settings, storage_settings
    from pipelines.jobs import replica_pods, tfjob_pipeline
    from trainer.config import settings

    if not args.image:
        raise UsageError("--image is required with --compile: the image this project's own steps run in")
    job = load(args.manifest)
    pods, storage = pod_settings(args), storage_settings(args)
    defaults = {}
    if args.publish_uri:
        if "://" not in args.publish_uri:
            raise UsageError(
                f"--publish-uri {args.publish_uri!r} is not allowed with --compile: a path is the publish pod's own "
                "disk, gone with the pod; allowed: s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (or --storage kfp)"
            )
        defaults["publish_uri"] = settings.check("publish_uri", args.publish_uri)
    if args.s3_endpoint:
        defaults["s3_endpoint"] = settings.check("s3_endpoint", args.s3_endpoint)
    for line in [*job.warnings, *(w for r in job.replicas for w in replica_pods(r, pods, job.deadline)[1])]:
        print(f"warning: {line}", file=sys.stderr)
    check_image(args.image)
    for replica in job.replicas:
        check_image(replica.image)
    if not args.output.endswith((".yaml", ".yml")):
        raise UsageError(f"--output {args.output!r} must end with .yaml or .yml")
    pipeline = tfjob_pipeline(job, args.image, args.saved_model, pods, storage, defaults)
    with tempfile.TemporaryDirectory() as tmp:
        compiler.Compiler().compile(pipeline, package_path=f"{tmp}/pipeline.yaml")
        write_text(args.output, Path(f"{tmp}/pipeline.yaml").read_text())
    print(f"pipeline YAML: {args.output}")


def run_job_locally(job: JobSpec, output_dir: str, saved_model: str = "", **arguments: Any) -> dict[str, Any]:
    """Runs every task of the job at once as a local process (`trainer.local_job`), then takes the chief's model.

    The chief's model is copied to `model` under the run's directory (as the pipeline's `chief model` step does) and
    published when `publish_uri` is given (as its `publish model` step does).

    Args:
        job: the job, its paths this machine's (`for_this_machine`).
        output_dir: where the run's directory (`<job name>-<time>`) goes.
        saved_model: where the chief's command writes its SavedModel (default `$(MODEL_DIR)/saved_model`).
        **arguments: `publish_uri` and `s3_endpoint`, and `trainer.local_job.run_job`'s settings
            (`startup_timeout`, ...); `max_restarts` defaults as in the compiled pipeline (`pipelines.jobs`).

    Returns:
        `seconds`, the run's directory `run`, the chief's `model`, its `metadata` and, with `publish_uri`, the
        `publication`.
    """
    from components.signatures import pipeline_default
    from trainer import local_job, steps
    from trainer.config import settings

    publish_uri = arguments.pop("publish_uri", "")
    s3_endpoint = arguments.pop("s3_endpoint", "")
    restarts = job.max_restarts(pipeline_default("max_restarts"))
    arguments = {"startup_timeout": settings.default("startup_timeout"), "max_restarts": restarts, **arguments}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = os.path.join(os.path.abspath(output_dir), f"{job.name}-{stamp}-{uuid.uuid4().hex[:6]}")
    result = local_job.run_job(job, run_dir, saved_model, run_id=os.path.basename(run_dir), **arguments)
    model = os.path.join(run_dir, "model")
    chief, record = steps.job_model(list(result.model_dirs), model)
    outcome = {
        "seconds": result.seconds,
        "run": run_dir,
        "model": model,
        "metadata": {"source_uri": chief, "task": record.task, "restarts": record.restarts, **record.metrics},
    }
    if publish_uri:
        outcome["publication"] = steps.publish_model(
            model, record.metrics, publish_uri, model_uri=chief, s3_endpoint=s3_endpoint
        )
    return outcome


def local_run(args: argparse.Namespace) -> None:
    """Runs the manifest's job here, every task a local process at once; prints where the model and publication are."""
    from trainer import local_job

    job = load(args.manifest)
    _warn(job)
    local_job.check_tasks(len(local_job.job_tasks(job)))
    root = os.path.abspath(args.output_dir)
    paths = local_paths(job, _mounts(args.mount), os.path.join(root, "volumes"))
    job = for_this_machine(job, paths)
    arguments = {}
    if args.publish_uri:
        arguments["publish_uri"] = args.publish_uri if "://" in args.publish_uri else os.path.abspath(args.publish_uri)
        arguments["s3_endpoint"] = getattr(args, "s3_endpoint", "") or ""
    saved_model = _rewrite(args.saved_model, paths) if args.saved_model else ""
    result = run_job_locally(job, os.path.join(root, "runs"), saved_model, **arguments)
    print(f"run took {result['seconds']} s")
    print(f"model: {result['model']}")
    if args.publish_uri:
        publication = result["publication"]
        if publication.published:
            print(f"published: version {publication.version} at {publication.path}")
        else:
            print(f"published: nothing: {publication.reason}")


def build_parser() -> argparse.ArgumentParser:
    """The command line: a manifest and one action, with the MNIST CLI's storage and pod options."""
    from pipelines.cli import add_pod_arguments, add_storage_arguments

    parser = argparse.ArgumentParser(prog="pipelines/tfjob.py", description=__doc__.splitlines()[0])
    parser.add_argument("manifest", help="a kubeflow.org/v1 TFJob manifest (YAML)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--compile", action="store_true", help="write the pipeline YAML")
    action.add_argument("--local", action="store_true", help="run every task of the job here at once, as processes")
    parser.add_argument("--image", help="--compile: the image this project's own steps run in")
    parser.add_argument("--output", default="tfjob_pipeline.yaml", help="--compile: the YAML file")
    parser.add_argument(
        "--saved-model",
        default="",
        help="where the chief's command writes its SavedModel, a path in its container (default "
        "$(MODEL_DIR)/saved_model); it becomes the pipeline's model and what publishing copies",
    )
    parser.add_argument(
        "--publish-uri",
        default="",
        help="publish the chief's model here: --compile: the default of the publish_uri parameter (s3:// or "
        "gs://); --local: also a path",
    )
    parser.add_argument(
        "--s3-endpoint", default="", help="the S3 endpoint of s3:// locations, such as http://seaweedfs.kubeflow:9000"
    )
    add_pod_arguments(
        parser, " (--compile: for a replica whose manifest gives no cpu or memory, and every task)", gpus=False
    )
    add_storage_arguments(parser, data=False)
    parser.add_argument(
        "--mount",
        action="append",
        default=[],
        metavar="PATH=HOST_DIR",
        help="--local: the container path PATH is HOST_DIR here (repeatable); a claim's mount path not given is a "
        "directory under --output-dir/volumes that every task shares",
    )
    parser.add_argument("--output-dir", default="out/tfjob", help="--local: where the run's files go")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one action; returns the exit code."""

    def body() -> int:
        args = build_parser().parse_args(argv)
        if args.compile:
            compile_job(args)
        else:
            local_run(args)
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
