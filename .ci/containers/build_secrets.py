"""The build's secrets: the host's pip settings that make sense in a container, its CA bundle and its apt mirror.

They reach the Dockerfile's pip and apt lines as BuildKit secret mounts, so no layer of the image holds them.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from common import PUBLIC_DEBIAN, debian_mirror, read_apt_sources, run

CONTAINER_CA = "/etc/ssl/certs/build-ca.crt"
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
KEPT = ("index-url", "extra-index-url", "trusted-host")
_PRECEDENCE = {"global": 0, "install": 1, ":env:": 2}
_LINE = re.compile(r"^(?P<section>[^.=\s]+)\.(?P<key>[^=\s]+)=(?P<value>.*)$")


def parse_pip_config_list(text: str) -> dict[str, str]:
    """The effective `pip install` settings in `pip config list` output: environment over [install] over [global].

    Args:
        text: lines such as `global.cert='/etc/ssl/certs/ca-certificates.crt'` or `:env:.find-links='/srv/wheelhouse'`.

    Returns:
        Setting name (lowercase, dashes) to value; sections other than global, install and :env: are ignored.
    """
    found: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if not match or match.group("section") not in _PRECEDENCE:
            continue
        rank = _PRECEDENCE[match.group("section")]
        key = match.group("key").lower().replace("_", "-")
        try:
            value = str(ast.literal_eval(match.group("value")))
        except (ValueError, SyntaxError):
            value = match.group("value").strip("'\"")
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, value)
    return {key: value for key, (_, value) in found.items()}


def _is_http(url: str) -> bool:
    return urlsplit(url).scheme in ("http", "https") and bool(urlsplit(url).netloc)


def container_pip_conf(settings: dict[str, str], ca_in_container: str | None = CONTAINER_CA) -> str:
    """A pip.conf for pip inside the build: only http(s) indexes, trusted hosts and the mounted CA bundle.

    Local paths (find-links, file:// indexes, constraint files) and everything else are dropped.

    Args:
        settings: effective host settings, as from `parse_pip_config_list`.
        ca_in_container: where the CA bundle secret is mounted, or None when there is none.

    Returns:
        The file's text, a `[global]` section with the kept settings in a fixed order.
    """
    lines = ["[global]"]
    for key in KEPT:
        values = settings.get(key, "").split()
        if key != "trusted-host":
            values = [v for v in values if _is_http(v)]
        if key == "index-url":
            values = values[:1]
        if values:
            lines.append(f"{key} = {' '.join(values)}")
    if ca_in_container:
        lines.append(f"cert = {ca_in_container}")
    return "\n".join(lines) + "\n"


def host_pip_settings() -> dict[str, str]:
    """The effective pip settings of this host (config files and PIP_* environment); empty when there is no pip."""
    for argv in ([sys.executable, "-m", "pip", "config", "list"], ["pip3", "config", "list"]):
        result = run(argv, timeout=60)
        if result.returncode == 0:
            return parse_pip_config_list(result.stdout)
    return {}


def host_ca_bundle(settings: dict[str, str]) -> Path | None:
    """The CA bundle the host's pip trusts: the file its `cert` names, else the system one; None if neither exists."""
    for candidate in (settings.get("cert"), SYSTEM_CA):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def write_secrets(directory: Path, settings: dict[str, str], apt_sources: str | None = None) -> list[str]:
    """Writes the pip.conf and apt secrets into `directory` (private, outside the build context) and names them.

    Args:
        directory: a private temporary directory.
        settings: effective host pip settings.
        apt_sources: the host's apt source text (default: read now); its bookworm mirror becomes the build's one-line
            sources.list unless it is the public mirror, which the base image names already.

    Returns:
        `docker build` options: `--secret id=pipconf,src=...`, and `--secret id=cacert,src=...` when there is a CA
        bundle, `--secret id=aptsources,src=...` when the host has a mirror of its own.
    """
    ca = host_ca_bundle(settings)
    conf = directory / "pip.conf"
    _private(conf, container_pip_conf(settings, CONTAINER_CA if ca else None))
    options = ["--secret", f"id=pipconf,src={conf}"]
    if ca:
        options += ["--secret", f"id=cacert,src={ca}"]
    mirror = debian_mirror(read_apt_sources() if apt_sources is None else apt_sources)
    if mirror != PUBLIC_DEBIAN:
        sources = directory / "sources.list"
        _private(sources, f"deb {mirror} bookworm main\n")
        options += ["--secret", f"id=aptsources,src={sources}"]
    return options
