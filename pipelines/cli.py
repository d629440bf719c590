"""The pipeline CLI (`python pipelines/mnist.py`): one action per run, each with only its own options.

Actions: --compile (write the YAML), --local (run here with kfp.local), --upload, --run, --schedule CRON and
--every DURATION (a KFP server). Compiling or uploading for a cluster needs the image every step runs in: --image or
$KFP_TF_IMAGE; nothing is assumed, because an unqualified default would make every pod fail with ImagePullBackOff.
"""

import argparse
import logging
import os
import re
import sys
import tempfile
import time
from typing import Any

from pipelines import server
from pipelines.factories import DEFAULT_PODS, DEFAULT_STORAGE, FACTORIES, NAMES, create_pipeline
from pipelines.local_run import LOCAL_MAX_WORKERS, LOCAL_OVERRIDES, run_local
from pipelines.pods import PodSettings
from pipelines.storage import KFP_KEYS, StorageSettings
from trainer import __version__
from trainer.config import settings
from trainer.config.flags import Parser
from trainer.core.entry import run_cli
from trainer.core.errors import UsageError
from trainer.core.files import write_text

log = logging.getLogger("pipelines")

IMAGE_ENV = "KFP_TF_IMAGE"
STRATEGY_ENV = "KFP_TF_STRATEGY"
TOKEN_FILE = "/var/run/secrets/kubeflow/pipelines/token"
ACTIONS = {
    "compile": "write the pipeline YAML",
    "local": "run the whole pipeline here with kfp.local",
    "upload": "upload to a KFP server (a new version if the name exists)",
    "run": "upload, then start one run",
    "schedule": "upload, then create a recurring run (KFP cron: 6 fields, seconds first)",
    "every": "upload, then create a recurring run every DURATION (e.g. 24h, 30m)",
}
SERVER_ACTIONS = ("upload", "run", "schedule", "every")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:]+\])"
)
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN}(?::[0-9]+)?)/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
    r":[0-9a-fA-F]{32,}))?$"
)


def check_image(image: str) -> str:
    """Checks an image reference against the OCI distribution grammar; warns when it names no registry.

    Raises:
        UsageError: naming the reference when no registry would accept it.
    """
    match = _REFERENCE.match(image or "")
    if not match or len(image.split("@")[0].rsplit(":", 1)[0]) > 255:
        raise UsageError(
            f"image {image!r} is not a valid image reference; allowed: [REGISTRY[:PORT]/]PATH[:TAG][@DIGEST] "
            "with a lowercase path, e.g. registry.example.com/team/kfp-tf-multiworker:0.1.0"
        )
    domain, path = match["domain"], match["path"]
    if domain is None or ("." not in domain and ":" not in domain and domain != "localhost"):
        log.warning(
            "image %r names no registry, so a cluster pulls it from docker.io/%s; that works only "
            "where the image is already on the nodes (kind load, minikube image load)",
            image,
            path if "/" in path else f"library/{path}",
        )
    return image


def pipeline_from_env() -> Any:
    """The pipeline `kfp dsl compile --py pipelines/mnist.py` compiles.

    Its image is $KFP_TF_IMAGE (required), its strategy $KFP_TF_STRATEGY (default: the contract's).
    """
    image = os.environ.get(IMAGE_ENV, "")
    if not image:
        raise SystemExit(
            f"error: ${IMAGE_ENV} is not set; set it to the image every step runs in, e.g. "
            f"{IMAGE_ENV}=registry.example.com/team/kfp-tf-multiworker:{__version__}"
        )
    strategy = os.environ.get(STRATEGY_ENV, settings.default("strategy"))
    try:
        settings.check("strategy", strategy)
    except UsageError as err:
        raise SystemExit(f"error: ${STRATEGY_ENV}: {err}") from None
    return create_pipeline(check_image(image), strategy)


def _action_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pipelines/mnist.py", add_help=False, description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    for action, what in ACTIONS.items():
        metavar = {"schedule": "CRON", "every": "DURATION"}.get(action)
        group.add_argument(f"--{action}", help=what, **({"metavar": metavar} if metavar else {"action": "store_true"}))
    return parser


def build_parser(action: str | None) -> argparse.ArgumentParser:
    """The parser for one action: the action flags, then only the options that apply to it."""
    description = __doc__ if action is None else f"{__doc__.splitlines()[0]} This is --{action}."
    parser = Parser(
        prog="pipelines/mnist.py",
        parents=[_action_parser()],
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if action in ("compile", *SERVER_ACTIONS):
        build = parser.add_argument_group("the pipeline")
        build.add_argument(
            "--image",
            default=os.environ.get(IMAGE_ENV),
            help=f"the image every step runs in (default: ${IMAGE_ENV}); required",
        )
        build.add_argument(
            "--strategy",
            default="multi_worker_mirrored",
            choices=list(FACTORIES),
            help="multi_worker_mirrored (default) or parameter_server (chief, ps and worker tasks)",
        )
        add_pod_arguments(parser)
        add_storage_arguments(parser)
    if action == "compile":
        parser.add_argument("--output", default="mnist_pipeline.yaml", help="the YAML path (default: %(default)s)")
    if action == "local":
        local = parser.add_argument_group("the local run")
        local.add_argument(
            "--num-workers",
            type=int,
            default=settings.default("num_workers"),
            help=f"workers (1 to {LOCAL_MAX_WORKERS})",
        )
        local.add_argument("--epochs", type=int, default=settings.default("epochs"), help="training epochs")
        local.add_argument(
            "--source", default=LOCAL_OVERRIDES["source"], help="data source (default: the shipped sample)"
        )
        local.add_argument(
            "--min-accuracy",
            type=float,
            default=settings.default("min_accuracy"),
            help="the quality gate before publishing",
        )
        local.add_argument("--gate", default=settings.default("gate"), help=settings.help_text("gate"))
        local.add_argument("--model-fn", default=settings.default("model_fn"), help=settings.help_text("model_fn"))
        local.add_argument("--publish-uri", default="", help="where a model that passes the gate is published")
        local.add_argument(
            "--tensorboard-dir", default="", help="where the chief writes TensorBoard event files (empty: none)"
        )
        local.add_argument("--output-dir", default="out/pipeline", help="the local pipeline root")
        local.add_argument(
            "--strategy", default="multi_worker_mirrored", help="only multi_worker_mirrored runs locally"
        )
    if action in SERVER_ACTIONS:
        server.add_server_arguments(parser, action, pipeline_name=NAMES["multi_worker_mirrored"])
    return parser


GPU_FIELDS = ("gpus", "accelerator", "gpu_image", "gpu_node_selector", "gpu_tolerations")


def add_pod_arguments(parser: argparse.ArgumentParser, what: str = "", gpus: bool = True) -> None:
    """The training pods' flags, one per `PodSettings` field; `what` is added to the group's title.

    `gpus`: also the GPU flags (a TFJob's replicas take theirs from the manifest).
    """
    pods = parser.add_argument_group("training pods" + what)
    for f in PodSettings.__dataclass_fields__.values():
        if not gpus and f.name in GPU_FIELDS:
            continue
        pods.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=f.default,
            help=f"{_attribute_doc(f.name)} (default: {f.default})",
        )


def add_storage_arguments(parser: argparse.ArgumentParser, data: bool = True) -> None:
    """The storage flags; `data`: also those of this project's own data and checkpoints (cache, volume)."""
    storage = parser.add_argument_group("storage (docs/storage.md)")
    storage.add_argument(
        "--storage",
        default="",
        choices=["", "kfp"],
        help="kfp: the pipeline's own object store (KFP 2.16+: SeaweedFS, the namespace's keys from the Secret "
        "mlpipeline-minio-artifact; models under s3://mlpipeline/private/{namespace}/); default: none",
    )
    storage.add_argument(
        "--storage-secret",
        default="",
        metavar="SECRET",
        help="another Secret whose keys become the S3 credentials of the steps that store (publish, deploy, the "
        "parameter-server tasks); default: none",
    )
    storage.add_argument(
        "--storage-secret-keys",
        default=KFP_KEYS,
        metavar="KEY=ENV,...",
        help="which key of --storage-secret becomes which variable (default: %(default)s)",
    )
    if data:
        storage.add_argument(
            "--no-cache-data",
            dest="cache_data",
            action="store_false",
            help="prepare the data again in every run, for a source whose data changes (your function, a rewritten "
            "IDX location); default: KFP reuses the data an earlier run prepared from the same source",
        )
        storage.add_argument(
            "--checkpoint-volume",
            default="",
            metavar="CLAIM",
            help="mount this ReadWriteMany PersistentVolumeClaim at /mnt/checkpoints on every training worker "
            "(the default of the checkpoint_claim parameter); default: none, checkpoints stay in the pod",
        )


def _attribute_doc(name: str) -> str:
    doc = PodSettings.__doc__ or ""
    match = re.search(rf"^\s+{name}: (.+?)(?=^\s+\w+: |\Z)", doc, re.M | re.S)
    return " ".join(match.group(1).split()) if match else name


def pod_settings(args: argparse.Namespace) -> PodSettings:
    """The training pods' settings from the parsed flags (a field without a flag keeps its default)."""
    given = {name: getattr(args, name) for name in PodSettings.__dataclass_fields__ if hasattr(args, name)}
    return PodSettings(**given)


def storage_settings(args: argparse.Namespace) -> StorageSettings:
    """The storage flags, checked; a checkpoint volume only for the strategy that checkpoints."""
    given = {name: getattr(args, name) for name in StorageSettings.__dataclass_fields__ if hasattr(args, name)}
    storage = StorageSettings(**given)
    if storage.checkpoint_volume and getattr(args, "strategy", "") != "multi_worker_mirrored":
        raise UsageError(
            "--checkpoint-volume is not allowed with --strategy parameter_server: its chief keeps no "
            "checkpoints (a lost worker is rescheduled instead); allowed with multi_worker_mirrored"
        )
    return storage


def compile_pipeline(
    output: str,
    image: str,
    strategy: str = "multi_worker_mirrored",
    pods: PodSettings = DEFAULT_PODS,
    storage: StorageSettings = DEFAULT_STORAGE,
) -> str:
    """Writes the pipeline YAML to `output` (through a temporary file) and returns the path."""
    from kfp import compiler

    if not output.endswith((".yaml", ".yml")):
        raise UsageError(f"--output {output!r} must end with .yaml or .yml")
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = create_pipeline(image, strategy, pods, storage)
        compiler.Compiler().compile(pipeline, package_path=f"{tmp}/pipeline.yaml")
        with open(f"{tmp}/pipeline.yaml") as f:
            write_text(output, f.read())
    return output


def _image(args: argparse.Namespace) -> str:
    if not args.image:
        raise UsageError(
            f"no image: pass --image REGISTRY/kfp-tf-multiworker:{__version__} (the image built from "
            f"this project's Dockerfile and pushed where the cluster pulls from) or set ${IMAGE_ENV}"
        )
    return check_image(args.image)


def _pods(args: argparse.Namespace, image: str) -> PodSettings:
    """The pod settings, their GPU image checked as --image is."""
    pods = pod_settings(args)
    if pods.gpus:
        check_image(pods.training_image(image))
    return pods


def _compile(args: argparse.Namespace) -> None:
    started = time.monotonic()
    image = _image(args)
    pods = _pods(args, image)
    compile_pipeline(args.output, image, args.strategy, pods, storage_settings(args))
    training = f", training image {pods.training_image(image)} with {pods.gpus} {pods.accelerator}" if pods.gpus else ""
    sys.stdout.write(
        f"wrote {args.output} ({NAMES[args.strategy]}, image {image}{training}) in {time.monotonic() - started:.2f}s\n"
    )


def _local(args: argparse.Namespace) -> None:
    if args.strategy != "multi_worker_mirrored":
        raise UsageError(
            f"--strategy {args.strategy} is not allowed with --local: kfp.local runs at most 2 tasks at once, "
            "and a chief, a parameter server and a worker must all run together; use trainer-launch --ps N"
        )
    result = run_local(
        args.output_dir,
        num_workers=args.num_workers,
        epochs=args.epochs,
        source=args.source,
        min_accuracy=args.min_accuracy,
        gate=args.gate,
        model_fn=args.model_fn,
        publish_uri=args.publish_uri,
        tensorboard_dir=args.tensorboard_dir,
    )
    lines = [f"pipeline finished in {result['seconds']}s", f"test metrics: {result['test metrics']}"]
    if result["accuracy"] >= 0:
        lines.append(f"test accuracy: {result['accuracy']:.4f}")
    names = ("serving check", "publish", "run", "model", "report", "tensorboard")
    lines += [f"{name}: {result[name]}" for name in names]
    # sys.stdout.write, not print: kfp.local leaves builtins.print patched to indent every line
    sys.stdout.write("\n" + "\n".join(lines) + "\n")
    sys.stdout.flush()


def _server(args: argparse.Namespace, action: str) -> int:
    image = _image(args)
    pods, storage = _pods(args, image), storage_settings(args)
    with tempfile.TemporaryDirectory() as tmp:
        package = compile_pipeline(os.path.join(tmp, "pipeline.yaml"), image, args.strategy, pods, storage)
        return server.to_server(args, action, package, token_file=TOKEN_FILE)


def main(argv: list[str] | None = None) -> int:
    """Runs one action of the pipeline CLI; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        known, _ = _action_parser().parse_known_args([a for a in argv if a not in ("-h", "--help")])
        action = next((a for a in ACTIONS if getattr(known, a)), None)
        if action is None and ("-h" in argv or "--help" in argv):
            build_parser(None).print_help()
            return 0
        if action is None:
            build_parser(None).print_help(sys.stderr)
            raise UsageError(f"no action: pass one of {', '.join('--' + a for a in ACTIONS)}")
        args = build_parser(action).parse_args(argv)
        if action == "compile":
            _compile(args)
        elif action == "local":
            _local(args)
        else:
            return _server(args, action)
        return 0

    return run_cli(body)
