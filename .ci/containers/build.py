"""CI tooling: the project's image on a machine that may have no Docker Engine and no Docker Hub (`make e2e`).

    python3 .ci/containers/build.py build [--tag TAG] [--build-arg NAME=VALUE ...]
                                                        # engine, base image, then `docker build` with pip secrets
    python3 .ci/containers/build.py engine              # only make sure a Docker Engine runs (for test harnesses)
    python3 .ci/containers/build.py base                # engine and the image to build on

Users build with `docker build .` (`make image`); this does the same build where that cannot run as it is. A Docker
Engine that answers is used as it is. Otherwise, as root, Debian's docker.io is installed and dockerd started here
(engine.py). A base image that cannot be pulled is replaced by a local stand-in with a tag of its own, passed as
`--build-arg BASE=...` (base.py). pip inside the build gets the host's pip settings and CA bundle as BuildKit secrets
(pip_secrets.py), so neither ends up in a layer.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from base import base_image, ensure_base, image_exists
from build_secrets import host_pip_settings, write_secrets
from common import SetupError, log, run
from engine import Engine, ensure_engine, find_builder

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_BUILD_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_TAG = re.compile(rf"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?{_NAME}(?:/{_NAME})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?$")


@dataclass(frozen=True)
class BuiltImage:
    """The result of a build.

    Attributes:
        tag: the image's name.
        image_id: its id (sha256:...).
        size: its size in bytes, as `docker image inspect` reports it.
        build_seconds: wall time of `docker build`.
        total_seconds: wall time including engine and base image.
        base: the image it was built on and how that was obtained ("present", "pulled", "stand-in ...").
    """

    tag: str
    image_id: str
    size: int
    build_seconds: float
    total_seconds: float
    base: str


def version(root: Path = ROOT) -> str:
    """The package version in trainer/__init__.py."""
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', (root / "trainer" / "__init__.py").read_text(), re.MULTILINE)
    if not match:
        raise SetupError("trainer/__init__.py has no __version__")
    return match.group(1)


def check_tag(tag: str) -> str:
    """Returns `tag` if it is a valid image reference.

    Raises:
        SetupError: it is not.
    """
    if not _TAG.match(tag):
        raise SetupError(
            f"--tag {tag!r} is not an image name: allowed is [REGISTRY/]NAME[:TAG], NAME lowercase letters, "
            "digits and separators . _ -"
        )
    return tag


def check_build_arg(build_arg: str) -> str:
    """Returns `build_arg` if it is NAME=VALUE for a build argument other than BASE (`--base` sets that).

    Raises:
        SetupError: it is not.
    """
    if not _BUILD_ARG.match(build_arg) or build_arg.startswith("BASE="):
        raise SetupError(
            f"--build-arg {build_arg!r} is not NAME=VALUE: allowed is a NAME of letters, digits and _ other than BASE "
            "(--base sets that), such as REQUIREMENTS=requirements/gpu"
        )
    return build_arg


def build_command(
    engine: Engine,
    builder_argv: list[str],
    secret_options: list[str],
    tag: str,
    base: str,
    dockerfile: Path = DOCKERFILE,
    context: Path = ROOT,
    build_args: tuple[str, ...] = (),
) -> list[str]:
    """The `docker build` command: host network on the engine started here (no NAT), secrets, build arguments, tag."""
    network = ["--network", "host"] if engine.managed else []
    return [
        *builder_argv,
        *network,
        *secret_options,
        "--build-arg",
        f"BASE={base}",
        *(option for build_arg in build_args for option in ("--build-arg", build_arg)),
        "--tag",
        tag,
        "--file",
        str(dockerfile),
        str(context),
    ]


def build(
    tag: str,
    dockerfile: Path = DOCKERFILE,
    context: Path = ROOT,
    base: str | None = None,
    build_args: tuple[str, ...] = (),
) -> BuiltImage:
    """Engine, base image, then `docker build` of `dockerfile` with the host's pip settings and CA as secrets.

    `base` (an image the engine holds, such as this project's for a user's image built FROM it) replaces the
    Dockerfile's `ARG BASE` default; `build_args` (NAME=VALUE) set its other arguments, such as the GPU image's
    REQUIREMENTS=requirements/gpu.

    Raises:
        SetupError: a prerequisite is missing, or a step failed (the build's own output is shown as it runs).
    """
    started = time.monotonic()
    engine = ensure_engine()
    if base is None:
        base, obtained = ensure_base(engine.cli, base_image(dockerfile))
    elif image_exists(engine.cli, base):
        obtained = "present"
    else:
        raise SetupError(f"the engine has no image {base} to build {tag} on; build it first")
    builder = find_builder()
    with tempfile.TemporaryDirectory(prefix="kfp-image-secrets-") as secrets:
        argv = build_command(
            engine,
            list(builder.argv),
            write_secrets(Path(secrets), host_pip_settings()),
            tag,
            base,
            dockerfile,
            context,
            build_args,
        )
        log.info("building %s with %s", tag, " ".join(builder.argv))
        build_started = time.monotonic()
        code = subprocess.run(argv, env={**os.environ, **dict(builder.env)}).returncode
        build_seconds = time.monotonic() - build_started
    if code != 0:
        raise SetupError(f"docker build of {tag} failed (exit {code}), output above", exit_code=1)
    inspected = run([engine.cli, "image", "inspect", "--format", "{{.Id}} {{.Size}}", tag], timeout=60).stdout.split()
    if len(inspected) != 2:
        raise SetupError(f"the build reported success but the engine has no image {tag}", exit_code=1)
    return BuiltImage(
        tag, inspected[0], int(inspected[1]), build_seconds, time.monotonic() - started, f"{base} ({obtained})"
    )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise SetupError(f"{message} (usage: {self.format_usage().strip().removeprefix('usage: ')})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line of deploy/image.py: a sub-command (build, engine, base) and its options."""
    parser = _Parser(prog=".ci/containers/build.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    build_parser = commands.add_parser("build", help="build the image (engine and base image first)")
    build_parser.add_argument("--tag", help="image name (default kfp-tf-multiworker:<trainer version>)")
    build_parser.add_argument(
        "--dockerfile", type=Path, default=DOCKERFILE, help="the Dockerfile (its directory is the context)"
    )
    build_parser.add_argument("--base", help="the image to build on (default: the Dockerfile's ARG BASE)")
    build_parser.add_argument(
        "--build-arg",
        action="append",
        default=[],
        dest="build_args",
        metavar="NAME=VALUE",
        help="a build argument other than BASE, e.g. REQUIREMENTS=requirements/gpu for the GPU image (repeatable)",
    )
    commands.add_parser("engine", help="only make sure a Docker Engine runs")
    commands.add_parser("base", help="make sure the engine holds an image to build on (the base, or its stand-in)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """The CLI: one `error:` line and exit 2 for bad input or a missing prerequisite, 1 for a failed step."""
    logging.basicConfig(level=logging.INFO, format="image: %(message)s", stream=sys.stderr)
    try:
        args = parse_args(argv)
        if args.command == "engine":
            engine = ensure_engine()
            print(f"Docker Engine ready: {engine.cli}, data root {engine.root_dir}")
        elif args.command == "base":
            engine = ensure_engine()
            base, obtained = ensure_base(engine.cli, base_image(DOCKERFILE))
            print(f"base image {base} ({obtained})")
        else:
            dockerfile = args.dockerfile.resolve()
            if not dockerfile.is_file():
                raise SetupError(f"--dockerfile {args.dockerfile} is not a file")
            built = build(
                check_tag(args.tag or f"kfp-tf-multiworker:{version()}"),
                dockerfile,
                dockerfile.parent,
                check_tag(args.base) if args.base else None,
                tuple(check_build_arg(build_arg) for build_arg in args.build_args),
            )
            print(
                f"image {built.tag} id {built.image_id} size {built.size / 1e9:.2f} GB ({built.size} bytes); "
                f"docker build {built.build_seconds:.1f} s, total {built.total_seconds:.1f} s (base image: "
                f"{built.base})"
            )
    except SetupError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
