""".ci/containers (the CI's image tooling) without Docker: build secrets, mirror hygiene of the stand-in base, builder
choice, bad input."""

import os
import stat
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / ".ci" / "containers"))
import base as image_base  # noqa: E402
import build as image  # noqa: E402
import build_secrets as image_secrets  # noqa: E402
import common as image_common  # noqa: E402
import engine as image_engine  # noqa: E402

MIRROR_HOST = "apt-cache.corp.example"
SOURCES = f"""Types: deb
# http://{MIRROR_HOST}/archive/debian/20250520T000000Z
URIs: http://{MIRROR_HOST}/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://{MIRROR_HOST}/debian-security
Suites: bookworm-security
Components: main
"""
PIP_CONFIG_LIST = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='60'
:env:.find-links='/srv/wheelhouse'
global.cert='/etc/ssl/certs/old-bundle.crt'
global.constraint='/etc/pip-constraints.txt'
global.extra-index-url='file:///srv/pypi/simple https://pypi.corp.example/simple /srv/wheels'
global.find-links='/srv/wheelhouse'
global.index-url='file:///srv/pypi/simple'
install.index-url='https://pypi.corp.example/root/pypi/+simple/'
install.trusted-host='pypi.corp.example'
"""


def test_pip_conf_keeps_http_indexes_trusted_hosts_and_the_mounted_ca_only():
    settings = image_secrets.parse_pip_config_list(PIP_CONFIG_LIST)
    assert settings["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert image_secrets.container_pip_conf(settings) == (
        "[global]\n"
        "index-url = https://pypi.corp.example/root/pypi/+simple/\n"
        "extra-index-url = https://pypi.corp.example/simple\n"
        "trusted-host = pypi.corp.example\n"
        "cert = /etc/ssl/certs/build-ca.crt\n"
    )


def test_pip_conf_of_a_host_without_settings_or_ca_is_an_empty_section():
    assert image_secrets.container_pip_conf(image_secrets.parse_pip_config_list(""), None) == "[global]\n"


def test_secrets_are_written_privately_and_name_the_ca_pip_trusts(tmp_path):
    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    options = image_secrets.write_secrets(secrets, {"cert": str(bundle), "find-links": "/srv/wheelhouse"}, SOURCES)
    assert options == [
        "--secret",
        f"id=pipconf,src={secrets / 'pip.conf'}",
        "--secret",
        f"id=cacert,src={bundle}",
        "--secret",
        f"id=aptsources,src={secrets / 'sources.list'}",
    ]
    for name in ("pip.conf", "sources.list"):
        assert stat.S_IMODE((secrets / name).stat().st_mode) == 0o600
    assert (secrets / "pip.conf").read_text() == "[global]\ncert = /etc/ssl/certs/build-ca.crt\n"
    assert (secrets / "sources.list").read_text() == f"deb http://{MIRROR_HOST}/debian bookworm main\n"
    assert sorted(p.name for p in secrets.iterdir()) == ["pip.conf", "sources.list"]


def test_a_host_on_the_public_debian_mirror_gives_the_build_no_apt_secret(tmp_path):
    options = image_secrets.write_secrets(tmp_path, {}, "deb http://deb.debian.org/debian bookworm main\n")
    assert "id=aptsources" not in " ".join(options) and not (tmp_path / "sources.list").exists()


def test_without_a_ca_bundle_pip_gets_no_cert_line(tmp_path, monkeypatch):
    monkeypatch.setattr(image_secrets, "SYSTEM_CA", tmp_path / "missing.crt")
    options = image_secrets.write_secrets(tmp_path, {"cert": str(tmp_path / "gone.crt")}, "")
    assert options == ["--secret", f"id=pipconf,src={tmp_path / 'pip.conf'}"]
    assert (tmp_path / "pip.conf").read_text() == "[global]\n"


def test_mirror_is_read_from_deb822_or_one_line_sources_and_public_hosts_are_not_private():
    assert image_common.debian_mirror(SOURCES) == f"http://{MIRROR_HOST}/debian"
    assert (
        image_common.debian_mirror(f"deb [arch=amd64] https://{MIRROR_HOST}/d bookworm main\n")
        == f"https://{MIRROR_HOST}/d"
    )
    disabled = SOURCES.replace("Types: deb\n#", "Enabled: no\nTypes: deb\n#", 1)
    assert image_common.debian_mirror(disabled) == image_common.PUBLIC_DEBIAN
    assert image_common.debian_mirror("deb http://deb.debian.org/debian trixie main\n") == image_common.PUBLIC_DEBIAN
    assert image_common.apt_hosts(SOURCES + "deb http://deb.debian.org/debian bookworm main\n") == [MIRROR_HOST]


def _debootstrapped(rootfs):
    """A root file system with the traces debootstrap and the chroot steps leave of the build host."""
    files = {
        "etc/apt/sources.list": f"deb http://{MIRROR_HOST}/debian bookworm main\n",
        "etc/apt/sources.list.d/extra.list": f"deb http://{MIRROR_HOST}/extra bookworm main\n",
        f"var/lib/apt/lists/{MIRROR_HOST}_debian_dists_bookworm_InRelease": "signed\n",
        "var/cache/apt/pkgcache.bin": f"\0\0{MIRROR_HOST.upper()}\0",
        "var/cache/apt/archives/python3_3.11.2-1_amd64.deb": "deb\n",
        "var/log/bootstrap.log": f"I: Retrieving InRelease from http://{MIRROR_HOST}/debian\n",
        "var/log/apt/history.log": f"Get http://{MIRROR_HOST}\n",
        "etc/resolv.conf": "search corp.example\nnameserver 10.0.0.53\n",
        "etc/hostname": "build-host-7\n",
        "root/.cache/pip/selfcheck.json": "{}\n",
        "usr/local/bin/python3": "#!/bin/true\n",
    }
    for name, text in files.items():
        (rootfs / name).parent.mkdir(parents=True, exist_ok=True)
        (rootfs / name).write_text(text)


def test_stand_in_root_file_system_keeps_nothing_of_the_mirror(tmp_path):
    rootfs = tmp_path / "rootfs"
    _debootstrapped(rootfs)
    needles = [h.encode() for h in image_common.apt_hosts(SOURCES)]
    assert len(image_base.find_leaks(rootfs, needles)) == 6
    image_base.sanitise_rootfs(rootfs)
    assert image_base.find_leaks(rootfs, needles) == []
    assert (rootfs / "etc/apt/sources.list").read_text() == "deb http://deb.debian.org/debian bookworm main\n"
    assert (rootfs / "etc/resolv.conf").read_text() == "" and (rootfs / "etc/hostname").read_text() == ""
    assert (rootfs / "usr/local/bin/python3").exists() and (rootfs / "var/lib/apt/lists").is_dir()


def test_leak_scan_finds_pip_config_files_and_needles_across_read_chunks(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/pip.conf").write_text("")
    (tmp_path / "big").write_bytes(b"x" * 10 + MIRROR_HOST.encode() + b"y" * 10)
    assert image_base.find_leaks(tmp_path, [MIRROR_HOST.encode()], chunk=16) == ["big", "etc/pip.conf"]


def test_nothing_the_build_is_given_names_the_mirror_outside_its_secret(tmp_path, monkeypatch):
    monkeypatch.setattr(image_secrets, "SYSTEM_CA", tmp_path / "missing.crt")
    settings = image_secrets.parse_pip_config_list(PIP_CONFIG_LIST + f"global.proxy='http://{MIRROR_HOST}:3128'\n")
    options = image_secrets.write_secrets(tmp_path, settings, SOURCES)
    engine = image_engine.Engine("docker", str(image_engine.DATA_ROOT))
    argv = image.build_command(engine, ["docker", "build"], options, "kfp-tf-multiworker:0.1.0", image_base.STAND_IN)
    assert argv[-1] == str(ROOT) and argv[argv.index("--network") + 1] == "host"
    assert argv[argv.index("--build-arg") + 1] == f"BASE={image_base.STAND_IN}"
    assert "--network" not in image.build_command(
        image_engine.Engine("docker", "/var/lib/docker"), ["docker", "build"], [], "t", "python:3.11.7-slim-bookworm"
    )
    assert not tmp_path.is_relative_to(ROOT)
    written = " ".join(argv) + "".join(p.read_text() for p in tmp_path.iterdir() if p.name != "sources.list")
    assert MIRROR_HOST not in written
    assert "apt-cache.corp.example" not in image_common.redact(
        f"from http://{MIRROR_HOST.upper()}/debian", [MIRROR_HOST]
    )


def _fake_docker(directory, version, buildx):
    script = directory / "docker"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && echo "Docker version {version}, build 0" && exit 0\n'
        f'[ "$1" = buildx ] && exit {0 if buildx else 1}\nexit 1\n'
    )
    script.chmod(0o755)
    return str(script)


def test_builder_is_buildx_or_a_cli_with_built_in_buildkit(tmp_path):
    for name in "abc":
        (tmp_path / name).mkdir()
    new_without_buildx = _fake_docker(tmp_path / "a", "28.2.2", buildx=False)
    debian = _fake_docker(tmp_path / "b", "20.10.24+dfsg1", buildx=False)
    with_buildx = _fake_docker(tmp_path / "c", "27.1.0", buildx=True)
    assert image_engine.find_builder([new_without_buildx, debian]) == image_engine.Builder(
        (debian, "build"), (("DOCKER_BUILDKIT", "1"),)
    )
    assert image_engine.find_builder([with_buildx, debian]).argv == (with_buildx, "buildx", "build", "--load")
    with pytest.raises(image_common.SetupError, match="BuildKit"):
        image_engine.find_builder([new_without_buildx])


def test_without_an_engine_a_non_root_user_gets_one_error_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(image_engine, "answering_engine", lambda: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(image_engine, "SOCKET", "unix:///nonexistent/docker.sock")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert image.main(["engine"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no Docker Engine answers")


@pytest.mark.parametrize("args", [["build", "--tag", "Not A Tag"], ["build", "--tag", "repo:"], [], ["frobnicate"]])
def test_bad_input_is_one_error_line_and_exit_2(args):
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "containers" / "build.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")


def test_default_tag_carries_the_package_version():
    import trainer

    assert image.version() == trainer.__version__
    assert image.check_tag(f"kfp-tf-multiworker:{image.version()}") == "kfp-tf-multiworker:0.1.0"
    assert image.check_tag("registry.example:5000/team/kfp-tf-multiworker:0.1.0-rc1")


def test_the_stand_in_base_has_a_tag_of_its_own_and_the_dockerfile_names_the_official_one():
    assert image_base.base_image(ROOT / "Dockerfile") == "python:3.11.7-slim-bookworm"
    assert image_base.STANDS_IN_FOR.match("python:3.11.7-slim-bookworm")
    assert not image_base.STANDS_IN_FOR.match(image_base.STAND_IN), "a machine that reaches Docker Hub builds on it"
    assert not image_base.STAND_IN.startswith(("python:", "docker.io/", "library/"))
