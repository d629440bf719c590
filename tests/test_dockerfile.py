"""The image definition: lint-clean, pinned, non-root, installing exactly what setup.cfg pins, pip secrets mounted "
"only."""

import configparser
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

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


def test_hadolint_reports_nothing_at_warning_or_above():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "style", "-"], input=DOCKERFILE, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_image_installs_exactly_the_pins_of_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    expected = _pins(
        cfg["options"]["install_requires"].splitlines() + cfg["options.extras_require"]["pipeline"].splitlines()
    )
    install = next(i for i in _pip_installs() if " -r " in i)
    requirements = _command(install).split(" -r ")[1].split()[0]
    assert _pins((ROOT / requirements).read_text().splitlines()) == expected
    assert all("==" in pin for pin in expected)


def test_base_image_pinned_user_non_root_no_baked_arguments():
    instructions = _instructions()
    base = next(i for i in instructions if i.startswith("FROM "))
    assert re.match(r"FROM python:\d+\.\d+\.\d+-slim-\w+$", base), base
    assert instructions[-1].startswith("USER ") and not instructions[-1].startswith("USER root")
    assert not any(i.startswith(("ENTRYPOINT", "CMD")) for i in instructions)
    assert "PYTHONUNBUFFERED=1" in DOCKERFILE


def test_dependencies_are_installed_before_the_code_and_the_sample_is_inside():
    instructions = _instructions()
    deps = instructions.index(next(i for i in _pip_installs() if " -r " in i))
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
    assert not re.search(r"^#\s*syntax\s*=", DOCKERFILE, re.MULTILINE | re.IGNORECASE), (
        "a syntax line pulls the frontend from Docker Hub"
    )
    leaky = [
        i
        for i in _instructions()
        if re.search(r"pip\.conf|pip\.ini|\.crt|\.pem|PIP_CERT|PIP_INDEX|PIP_CONFIG_FILE", _command(i))
    ]
    assert leaky == []
