"""The image definition: lint-clean, pinned, non-root, installing exactly what setup.cfg pins, pip secrets mounted "
"only."""

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions():
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def _command(instruction):
    """A RUN instruction's command without its `--mount=...` options."""
    return re.sub(r"^RUN\s+(--\S+\s+)*", "", instruction)


def _pip_installs():
    return [i for i in _instructions() if i.startswith("RUN ") and _command(i).startswith("pip install")]


def _pins(lines):
    return sorted(
        line.strip().lower().replace("_", "-") for line in lines if line.strip() and not line.strip().startswith("#")
    )


@pytest.mark.parametrize(
    "dockerfile",
    [
        "Dockerfile",
        "pipelines/tabular_example/Dockerfile",
        "pipelines/tfjob_example/Dockerfile",
        ".ci/containers/tensorflow/Dockerfile",
    ],
)
def test_hadolint_reports_nothing_at_warning_or_above(dockerfile):
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "style", "-"],
        input=(ROOT / dockerfile).read_text(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def _requirement_files():
    return [ROOT / path for i in _pip_installs() for path in re.findall(r"-r\s+/?(\S+)", _command(i))]


def test_image_installs_what_the_steps_import_pinned_as_setup_cfg_pins_it():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = dict(
        pin.split("==")
        for pin in _pins(
            cfg["options"]["install_requires"].splitlines() + cfg["options.extras_require"]["pipeline"].splitlines()
        )
    )
    files = _requirement_files()
    assert [f.name for f in files] == ["image.txt", "image-no-deps.txt"]
    installed = dict(pin.split("==") for f in files for pin in _pins(f.read_text().splitlines()))
    assert installed.pop("tensorflow-cpu") == declared.pop("tensorflow"), "the CPU build of the same TensorFlow"
    assert declared.pop("kfp-kubernetes"), "only compiling the pipeline needs kfp-kubernetes"
    assert installed == declared
    no_deps = next(i for i in _pip_installs() if "image-no-deps.txt" in i)
    assert re.search(r"pip install [^&]*--no-deps [^&]*-r /requirements/image-no-deps.txt", _command(no_deps))


def test_base_image_pinned_user_non_root_no_baked_arguments():
    instructions = _instructions()
    assert re.match(r"ARG BASE=python:\d+\.\d+\.\d+-slim-\w+$", instructions[0]), instructions[0]
    stages = [i for i in instructions if i.startswith("FROM ")]
    assert stages == ["FROM ${BASE} AS dependencies", "FROM ${BASE}"], "both stages build on BASE"
    final = instructions[instructions.index("FROM ${BASE}") :]
    assert any(i.startswith("COPY --from=dependencies /install /usr/local") for i in final)
    assert not any(i.startswith("RUN") and "apt-get" in i for i in final), "no build tool reaches the image"
    assert instructions[-1].startswith("USER ") and not instructions[-1].startswith("USER root")
    assert not any(i.startswith(("ENTRYPOINT", "CMD")) for i in instructions)
    assert "PYTHONUNBUFFERED=1" in DOCKERFILE


def test_dependencies_are_installed_before_the_code_and_the_sample_is_inside():
    instructions = _instructions()
    deps = instructions.index(next(i for i in instructions if i.startswith("COPY --from=dependencies")))
    code = next(n for n, i in enumerate(instructions) if i.startswith("COPY trainer/"))
    assert deps < code
    assert any(i.startswith("COPY data/mnist-sample/") for i in instructions)
    sample_env = re.search(r"TRAINER_SAMPLE_DIR=(\S+)", DOCKERFILE).group(1)
    copy = next(i for i in instructions if i.startswith("COPY data/mnist-sample/")).split()[-1]
    workdir = next(i for i in instructions if i.startswith("WORKDIR ")).split()[1]
    assert sample_env.rstrip("/") == f"{workdir}/{copy}".rstrip("/")


def test_pip_gets_the_build_hosts_config_and_ca_only_as_build_secrets():
    installs = _pip_installs()
    assert len(installs) == 2
    for install in installs:
        mounts = re.findall(r"--mount=(\S+)", install)
        assert sorted(mounts) == [
            "type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt",
            "type=secret,id=pipconf,target=/etc/pip.conf",
        ]
    apt = [i for i in _instructions() if i.startswith("RUN ") and "apt-get" in i]
    assert len(apt) == 1 and re.findall(r"--mount=(\S+)", apt[0]) == [
        "type=secret,id=aptsources,target=/etc/apt/sources.list"
    ]
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.MULTILINE | re.IGNORECASE), (
        "a syntax line pulls the frontend from Docker Hub"
    )
    leaky = [
        i
        for i in _instructions()
        if re.search(r"pip\.conf|pip\.ini|\.crt|\.pem|PIP_CERT|PIP_INDEX|PIP_CONFIG_FILE", _command(i))
    ]
    assert leaky == []
