"""The Dockerfile's base image (its `BASE` build argument): present, pulled, or a stand-in made from Debian packages.

CI machines without Docker Hub get a stand-in for `python:3.11.X-slim-bookworm`: debootstrap's minbase bookworm with
Debian's python3 in a venv at /usr/local, so `python`, `python3`, `pip` and `pip3` are in /usr/local/bin as in the
official image. It is tagged `STAND_IN` (never the official name, so a machine that later reaches Docker Hub builds on
the real image) and passed to the build as `--build-arg BASE=...`. Its apt sources name the public Debian mirror; it
holds no apt lists, no host CA and no pip configuration.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from common import (
    PUBLIC_DEBIAN,
    STATE_DIR,
    SetupError,
    apt_hosts,
    apt_install,
    debian_mirror,
    log,
    read_apt_sources,
    redact,
    run,
    tail,
)

PULL_TIMEOUT = 120
STANDS_IN_FOR = re.compile(r"^(docker\.io/)?(library/)?python:3\.11\.\d+-slim-bookworm$")
STAND_IN = "kfp-tf-ci/python-stand-in:3.11-slim-bookworm"
PACKAGES = "python3-venv,python3-wheel-whl,ca-certificates,netbase"
CHROOT_ENV = [
    "/usr/bin/env",
    "-i",
    "PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
    "PIP_DISABLE_PIP_VERSION_CHECK=1",
    "PIP_NO_CACHE_DIR=1",
]
IMPORT_CHANGES = [
    "ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
    'LABEL org.opencontainers.image.description="Local stand-in: Debian bookworm python3 in a venv at /usr/local"',
]
FORBIDDEN_NAMES = frozenset({"pip.conf", "pip.ini"})


def base_image(dockerfile: Path) -> str:
    """The default of the Dockerfile's `ARG BASE=...` (the image its FROM builds on).

    Raises:
        SetupError: the Dockerfile declares no BASE default.
    """
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"^\s*ARG\s+BASE=(\S+)", line, re.IGNORECASE)
        if match:
            return match.group(1)
    raise SetupError(f"{dockerfile} has no ARG BASE=IMAGE line")


def image_exists(cli: str, name: str) -> bool:
    """Whether the engine holds an image called `name`."""
    return run([cli, "image", "inspect", "--format", "{{.Id}}", name], timeout=60).returncode == 0


def ensure_base(cli: str, name: str) -> tuple[str, str]:
    """The image to build on for the base `name`: `name` itself when present or pulled, else the stand-in.

    Returns:
        (image to pass as BASE, how it was obtained: "present", "pulled", "stand-in present" or "stand-in made").

    Raises:
        SetupError: it cannot be pulled and no stand-in can be made for it (not root, or not
        python:3.11.X-slim-bookworm).
    """
    if image_exists(cli, name):
        return name, "present"
    log.info("pulling %s", name)
    pulled = run([cli, "pull", name], timeout=PULL_TIMEOUT)
    if pulled.returncode == 0:
        return name, "pulled"
    log.info("could not pull %s (%s)", name, tail(pulled.stderr or pulled.stdout, 1))
    if not STANDS_IN_FOR.match(name):
        raise SetupError(
            f"base image {name} cannot be pulled, and a local stand-in can only be made for python:3.11.X-slim-bookworm"
        )
    if image_exists(cli, STAND_IN):
        return STAND_IN, "stand-in present"
    if os.geteuid() != 0:
        raise SetupError(
            f"base image {name} cannot be pulled; making a local stand-in needs root (debootstrap, chroot)"
        )
    build_stand_in(cli, STAND_IN)
    return STAND_IN, "stand-in made"


def build_stand_in(cli: str, name: str) -> None:
    """Makes the stand-in base image `name` with debootstrap and `docker import`.

    Raises:
        SetupError: debootstrap or a step in the chroot failed, or the finished root file system still names the mirror.
    """
    if not shutil.which("debootstrap"):
        log.info("installing debootstrap")
        apt_install(["debootstrap"])
    sources = read_apt_sources()
    hosts = apt_hosts(sources)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="base-rootfs-", dir=STATE_DIR))
    try:
        log.info("making a stand-in for %s with debootstrap (about 2 minutes)", name)
        bootstrap(rootfs, debian_mirror(sources), hosts)
        install_python(rootfs)
        sanitise_rootfs(rootfs)
        leaks = find_leaks(rootfs, [h.encode() for h in hosts])
        if leaks:
            raise SetupError(
                f"the stand-in root file system still names the apt mirror or holds pip config in {len(leaks)} files, "
                f"e.g. {redact(leaks[0], hosts)}",
                exit_code=1,
            )
        import_rootfs(cli, rootfs, name)
    finally:
        remove_rootfs(rootfs)


def bootstrap(rootfs: Path, mirror: str, hosts: list[str]) -> None:
    """Debootstrap's minbase bookworm with python3-venv into `rootfs`.

    The output is shown (mirror redacted) only on failure.
    """
    result = run(
        ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm", rootfs, mirror], timeout=1800
    )
    if result.returncode != 0:
        log.warning("%s", redact(tail(result.stdout + result.stderr), hosts))
        raise SetupError(f"debootstrap failed (exit {result.returncode}), output above", exit_code=1)


def install_python(rootfs: Path) -> None:
    """A venv of Debian's python3 at /usr/local with pip, setuptools and wheel, all from Debian's wheel packages."""
    steps = [
        ["python3", "-m", "venv", "/usr/local"],
        ["/usr/local/bin/pip", "install", "--no-index", "--find-links", "/usr/share/python-wheels", "wheel"],
    ]
    subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
    try:
        for step in steps:
            result = run(["chroot", rootfs, *CHROOT_ENV, *step], timeout=600)
            if result.returncode != 0:
                log.warning("%s", tail(result.stdout + result.stderr))
                raise SetupError(
                    f"`{' '.join(step)}` failed in the stand-in (exit {result.returncode}), output above", exit_code=1
                )
    finally:
        subprocess.run(["umount", str(rootfs / "proc")], check=False)
    for script in (rootfs / "usr" / "local" / "bin").glob("[Aa]ctivate*"):
        script.unlink()


def sanitise_rootfs(rootfs: Path) -> None:
    """Leaves nothing of the build host in `rootfs`: public apt sources, no apt lists or caches, no logs, no resolver.

    debootstrap writes the mirror into /etc/apt/sources.list and its log, and copies the host's resolv.conf and
    hostname.
    """
    apt = rootfs / "etc" / "apt"
    (apt / "sources.list").write_text(f"deb {PUBLIC_DEBIAN} bookworm main\n")
    _clear(apt / "sources.list.d")
    _clear(rootfs / "var" / "lib" / "apt" / "lists", keep={"partial", "lock"})
    _clear(rootfs / "var" / "lib" / "apt" / "lists" / "partial")
    _clear(rootfs / "var" / "cache" / "apt", keep={"archives"})
    _clear(rootfs / "var" / "cache" / "apt" / "archives", keep={"partial", "lock"})
    _clear(rootfs / "var" / "log", files_only=True)
    _clear(rootfs / "root", keep={".bashrc", ".profile"})
    _clear(rootfs / "tmp")
    for name in ("resolv.conf", "hostname"):
        path = rootfs / "etc" / name
        if path.is_symlink() or path.exists():
            path.unlink()
        path.write_text("")


def _clear(directory: Path, keep: Iterable[str] = (), files_only: bool = False) -> None:
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name in keep:
            continue
        if path.is_dir() and not path.is_symlink():
            if files_only:
                _clear(path, files_only=True)
            else:
                shutil.rmtree(path)
        else:
            path.unlink()


def find_leaks(root: Path, needles: list[bytes], chunk: int = 1 << 22) -> list[str]:
    """Files under `root` whose name or content holds one of `needles`, or that are named pip.conf / pip.ini.

    Returns:
        Paths relative to `root`, sorted.
    """
    lowered = [n.lower() for n in needles if n]
    overlap = max((len(n) for n in lowered), default=1) - 1
    leaks = []
    for path in root.rglob("*"):
        relative = str(path.relative_to(root))
        if path.name in FORBIDDEN_NAMES or any(n.decode() in relative.lower() for n in lowered):
            leaks.append(relative)
        elif path.is_file() and not path.is_symlink() and lowered and _holds(path, lowered, chunk, overlap):
            leaks.append(relative)
    return sorted(leaks)


def _holds(path: Path, needles: list[bytes], chunk: int, overlap: int) -> bool:
    carry = b""
    with open(path, "rb") as data:
        while block := data.read(chunk):
            window = (carry + block).lower()
            if any(n in window for n in needles):
                return True
            carry = window[-overlap:] if overlap else b""
    return False


def import_rootfs(cli: str, rootfs: Path, name: str) -> None:
    """`docker import` of `rootfs` as `name` with the official image's PATH, LANG and CMD."""
    changes = [arg for change in IMPORT_CHANGES for arg in ("--change", change)]
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    result = subprocess.run([cli, "import", *changes, "-", name], stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    if tar.wait() != 0 or result.returncode != 0:
        raise SetupError(f"docker import of the stand-in failed: {tail(result.stderr, 1)}", exit_code=1)
    log.info("stand-in %s imported", name)


def remove_rootfs(rootfs: Path) -> None:
    """Deletes the temporary root file system, unless something is still mounted inside it."""
    mounts = Path("/proc/mounts").read_text().split()
    if any(m == str(rootfs) or m.startswith(f"{rootfs}/") for m in mounts):
        log.warning("%s still has mounts inside; left in place", rootfs)
        return
    shutil.rmtree(rootfs, ignore_errors=True)
