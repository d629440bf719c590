"""What the image tools share: the expected-failure type, running commands, and this host's apt sources."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

STATE_DIR = Path("/var/lib/kfp-tf-multiworker")
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
PUBLIC_DEBIAN = "http://deb.debian.org/debian"
PUBLIC_DEBIAN_HOSTS = frozenset({"deb.debian.org", "security.debian.org", "ftp.debian.org", "snapshot.debian.org"})

log = logging.getLogger("kfp-image")

_URI = re.compile(r"\b[a-z][a-z0-9+.-]*://([^/\s:\]]+)")


class SetupError(Exception):
    """An expected failure (bad input or a missing prerequisite): reported as one `error:` line.

    Attributes:
        exit_code: 2 for bad input or a missing prerequisite, 1 for a step that ran and failed.
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def run(argv: Sequence[str | os.PathLike], timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Runs a command with text output captured; a missing program or a timeout is a failed result, not an exception.

    Args:
        argv: the command.
        timeout: seconds before the command is killed.
        **kwargs: passed to `subprocess.run` (for example `env`, `input`).

    Returns:
        The finished process; returncode 127 when the program does not exist, 124 after a timeout.
    """
    argv = [str(a) for a in argv]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as err:
        return subprocess.CompletedProcess(argv, 127, "", str(err))
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(
            argv, 124, _text(err.stdout), _text(err.stderr) + f"\ntimed out after {timeout} s"
        )


def _text(output: bytes | str | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def read_apt_sources(locations: Iterable[Path] = APT_SOURCES) -> str:
    """The text of every apt source file (`sources.list`, `*.list`, `*.sources`); empty when there are none."""
    texts = []
    for location in locations:
        files = sorted(location.glob("*")) if location.is_dir() else [location]
        for path in files:
            if path.is_file() and (path.name == "sources.list" or path.suffix in (".list", ".sources")):
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def apt_hosts(sources_text: str) -> list[str]:
    """Host names of the package mirrors in apt source text, public Debian hosts left out (they may appear anywhere)."""
    hosts = dict.fromkeys(m.group(1).lower() for m in _URI.finditer(sources_text))
    return [h for h in hosts if h not in PUBLIC_DEBIAN_HOSTS]


def debian_mirror(sources_text: str, suite: str = "bookworm") -> str:
    """The first enabled `deb` URI serving `suite` in apt source text (one-line or deb822), else the public mirror."""
    for stanza in re.split(r"\n\s*\n", sources_text):
        fields = {}
        for line in stanza.splitlines():
            if line.strip().startswith("#"):
                continue
            match = re.match(r"^(\w[\w-]*):\s*(.*)$", line.strip())
            if match:
                fields[match.group(1).lower()] = match.group(2).split()
            elif re.match(r"^deb\s", line.strip()):
                words = re.sub(r"\[[^\]]*\]", " ", line).split()
                if len(words) >= 3 and words[2] == suite:
                    return words[1]
        if "deb" in fields.get("types", []) and suite in fields.get("suites", []) and fields.get("uris"):
            if fields.get("enabled", ["yes"])[0].lower() != "no":
                return fields["uris"][0]
    return PUBLIC_DEBIAN


def redact(text: str, hosts: Iterable[str]) -> str:
    """`text` with each of `hosts` replaced by `<apt mirror>`, for output that may end up in a log."""
    for host in hosts:
        text = re.sub(re.escape(host), "<apt mirror>", text, flags=re.IGNORECASE)
    return text


def tail(text: str, lines: int = 15) -> str:
    """The last `lines` lines of `text`."""
    return "\n".join(text.strip().splitlines()[-lines:])


_apt_updated = False


def apt_install(packages: Sequence[str]) -> None:
    """Installs Debian packages non-interactively (one `apt-get update` per process); output is shown only on failure.

    Raises:
        SetupError: not root, no apt-get, or apt-get failed (its output is logged with the mirror host redacted).
    """
    global _apt_updated
    if os.geteuid() != 0:
        raise SetupError(
            f"{' '.join(packages)} must be installed, which needs root (apt-get install {' '.join(packages)})"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    hosts = apt_hosts(read_apt_sources())
    steps = [] if _apt_updated else [["apt-get", "update", "-qq"]]
    steps.append(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages])
    for argv in steps:
        result = run(argv, timeout=900, env=env)
        if result.returncode != 0:
            log.warning("%s", redact(tail(result.stdout + result.stderr), hosts))
            raise SetupError(f"`{' '.join(argv)}` failed (exit {result.returncode}), output above", exit_code=1)
    _apt_updated = True
