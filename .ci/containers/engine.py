"""A Docker Engine to build and run the image: the one that answers, or Debian's dockerd started here as root."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from common import STATE_DIR, SetupError, apt_install, log, run, tail

DATA_ROOT = STATE_DIR / "docker"
RUN_DIR = Path("/run/kfp-tf-multiworker")
PIDFILE = RUN_DIR / "dockerd.pid"
LOG_FILE = STATE_DIR / "dockerd.log"
SOCKET = "unix:///var/run/docker.sock"
BRIDGE_IP = "198.19.255.1/24"
START_TIMEOUT = 60.0
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Engine:
    """A Docker Engine that answers `docker info`.

    Attributes:
        cli: the docker CLI used to reach it.
        root_dir: the engine's data root.
        managed: True for the dockerd this module starts (no NAT: builds and containers use the host network).
    """

    cli: str
    root_dir: str

    @property
    def managed(self) -> bool:
        """Whether this is the engine `make image` started (its state under /var/lib/kfp-tf-multiworker)."""
        return Path(self.root_dir) == DATA_ROOT


@dataclass(frozen=True)
class Builder:
    """A docker CLI invocation that builds with BuildKit (needed for `RUN --mount=type=secret`).

    Attributes:
        argv: the command up to the build options, e.g. `docker buildx build --load`.
        env: extra environment for it, e.g. `DOCKER_BUILDKIT=1`.
    """

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def docker_clis() -> list[str]:
    """The docker CLIs on this machine, the one on PATH first, then Debian's `/usr/bin/docker`."""
    found = [shutil.which("docker"), shutil.which("docker", path="/usr/bin")]
    return list(dict.fromkeys(c for c in found if c))


def engine_root(cli: str) -> str | None:
    """The data root of the engine `cli` reaches, or None when no engine answers."""
    result = run([cli, "info", "--format", "{{.DockerRootDir}}"], timeout=30)
    root = result.stdout.strip()
    return root if result.returncode == 0 and root else None


def answering_engine() -> Engine | None:
    """The engine that some docker CLI here reaches, if any."""
    for cli in docker_clis():
        root = engine_root(cli)
        if root:
            return Engine(cli, root)
    return None


def ensure_engine() -> Engine:
    """Returns a running Docker Engine, installing Debian's docker.io and starting dockerd when root and none answers.

    The dockerd started here keeps its state in /var/lib/kfp-tf-multiworker/docker (later builds are warm), logs to
    /var/lib/kfp-tf-multiworker/dockerd.log, leaves iptables and ip_forward alone, uses a bridge in 198.18.0.0/15,
    listens
    on /var/run/docker.sock and keeps running after this process ends.

    Raises:
        SetupError: no engine answers and this is not root (or the socket is not open to this user), DOCKER_HOST
            names an engine that does not answer, or dockerd did not come up.
    """
    engine = answering_engine()
    if engine:
        return engine
    if os.environ.get("DOCKER_HOST"):
        raise SetupError(
            f"DOCKER_HOST={os.environ['DOCKER_HOST']} does not answer `docker info`; start that engine or unset "
            "DOCKER_HOST"
        )
    socket = Path(SOCKET.removeprefix("unix://"))
    if os.geteuid() != 0 and socket.exists() and not os.access(socket, os.R_OK | os.W_OK):
        raise SetupError(f"{socket} is not open to this user: add it to the docker group, or run as root")
    if os.geteuid() != 0:
        raise SetupError(
            "no Docker Engine answers `docker info`: start one, or run as root to have Debian's docker.io "
            "installed and dockerd started"
        )
    dockerd = shutil.which("dockerd", path=SBIN_PATH)
    if not dockerd or not docker_clis():
        log.info("installing Debian's docker.io")
        apt_install(["docker.io"])
        engine = answering_engine()
        if engine:
            return engine
        dockerd = shutil.which("dockerd", path=SBIN_PATH)
        if not dockerd:
            raise SetupError("docker.io is installed but there is no dockerd on PATH")
    return start_dockerd(dockerd)


def start_dockerd(dockerd: str) -> Engine:
    """Starts dockerd in the background (own session, output to LOG_FILE) and waits until it answers.

    Raises:
        SetupError: dockerd exited or did not answer within START_TIMEOUT seconds.
    """
    for directory in (DATA_ROOT, RUN_DIR):
        directory.mkdir(parents=True, exist_ok=True, mode=0o711)
    argv = [
        dockerd,
        "--data-root",
        str(DATA_ROOT),
        "--exec-root",
        str(RUN_DIR / "exec"),
        "--pidfile",
        str(PIDFILE),
        "--host",
        SOCKET,
        "--storage-driver",
        "overlay2",
        "--bip",
        BRIDGE_IP,
        "--iptables=false",
        "--ip-forward=false",
        "--ip-masq=false",
    ]
    log.info("starting dockerd (state %s, log %s)", DATA_ROOT, LOG_FILE)
    with open(LOG_FILE, "ab") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        engine = answering_engine()
        if engine:
            log.info("dockerd %d answers", process.pid)
            return engine
        if process.poll() is not None:
            log.warning("%s", tail(LOG_FILE.read_text(errors="replace")))
            raise SetupError(f"dockerd exited with {process.returncode}; its log is {LOG_FILE}", exit_code=1)
        time.sleep(0.5)
    raise SetupError(
        f"dockerd {process.pid} did not answer within {START_TIMEOUT:.0f} s; its log is {LOG_FILE}", exit_code=1
    )


def cli_version(cli: str) -> tuple[int, ...]:
    """The client version of a docker CLI from `docker --version`, e.g. (20, 10, 24); () when unknown."""
    match = re.search(r"version (\d+)\.(\d+)\.(\d+)", run([cli, "--version"], timeout=30).stdout)
    return tuple(int(part) for part in match.groups()) if match else ()


def find_builder(clis: list[str] | None = None) -> Builder:
    """A docker CLI that builds with BuildKit secrets.

    `docker buildx build` if there is buildx, else a 20.10+ CLI below 23 with DOCKER_BUILDKIT=1 (BuildKit built in;
    from 23 on it needs buildx).

    Raises:
        SetupError: no docker CLI here can build with BuildKit.
    """
    for cli in docker_clis() if clis is None else clis:
        if run([cli, "buildx", "version"], timeout=30).returncode == 0:
            return Builder((cli, "buildx", "build", "--load"))
        if (20, 10) <= cli_version(cli)[:2] < (23, 0):
            return Builder((cli, "build"), (("DOCKER_BUILDKIT", "1"),))
    raise SetupError(
        "no docker CLI here builds with BuildKit secrets: install the buildx plugin, or Debian's docker.io "
        "(/usr/bin/docker 20.10 has BuildKit built in)"
    )
