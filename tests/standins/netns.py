"""Network-namespace "pods" for tests that need a pod's own resolver and a real, non-loopback pod IP (root only).

A `NetnsPod` is a network namespace joined to the host by one veth pair on a /30 inside 198.18.0.0/15 (the
benchmarking range: nothing outside the test uses it, and with no default route in the namespace nothing else is
reachable). `ip netns exec` bind-mounts `/etc/netns/<name>/resolv.conf` over `/etc/resolv.conf`, so glibc in the
namespace uses the kubelet's resolver settings (`cluster.resolv_conf`). `run` can also mount a service-account directory
at `/var/run/secrets/kubernetes.io/serviceaccount` in a private mount namespace, as a pod has it.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from pathlib import Path

from tests.standins.incluster import SERVICEACCOUNT_MOUNT

BENCHMARKING = ipaddress.ip_network("198.18.0.0/15")
ETC_NETNS = Path("/etc/netns")

# Run as `sh -c SCRIPT pod SERVICEACCOUNT_DIR ARGV...`: a private /run (so the host sees nothing) with the
# service-account directory bind-mounted read-only where the kubernetes client looks for it.
_MOUNT_SERVICEACCOUNT = """set -e
mount -t tmpfs -o size=1m,mode=755 pod-run "{run}"
mkdir -p "{mount}"
mount --bind -o ro "$1" "{mount}"
shift
exec "$@"
"""


def unavailable() -> str | None:
    """Why network-namespace pods cannot be made here (not root, tools missing), or None when they can."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces, veths and mounts"
    missing = [tool for tool in ("ip", "unshare", "mount") if not shutil.which(tool)]
    return f"needs {', '.join(missing)} (iproute2, util-linux)" if missing else None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def free_subnet(within: str = "198.18.77.0/24") -> ipaddress.IPv4Network:
    """A /30 inside `within` (itself inside 198.18.0.0/15) that no address on this host overlaps.

    The search starts at a block picked from the process id, so concurrent test runs rarely try the same one.
    """
    network = ipaddress.ip_network(within)
    if not network.subnet_of(BENCHMARKING):
        raise ValueError(f"{within} is outside {BENCHMARKING}; test traffic stays inside it")
    used = [ipaddress.ip_interface(line.split()[3]).network for line in _ip("-o", "-4", "addr").stdout.splitlines()]
    blocks = list(network.subnets(new_prefix=30))
    start = os.getpid() % len(blocks)
    for block in blocks[start:] + blocks[:start]:
        if not any(block.overlaps(other) for other in used):
            return block
    raise RuntimeError(f"every /30 in {within} overlaps an address on this host")


class NetnsPod:
    """One namespace "pod": `host_ip` on the host's veth, `pod_ip` on the pod's `eth0`, both in `subnet`.

    Args:
        name: the namespace's name; unique on the host, at most 14 characters (the host veth is `v<name>`).
        subnet: a /30 inside 198.18.0.0/15, e.g. from `free_subnet()`.
        resolv_conf: the pod's /etc/resolv.conf text (see `cluster.resolv_conf()`); None leaves the host's.
    """

    def __init__(self, name: str, subnet: ipaddress.IPv4Network | str, resolv_conf: str | None = None):
        if len(name) > 14:
            raise ValueError(f"namespace name {name!r} is longer than 14 characters")
        self.subnet = ipaddress.ip_network(subnet)
        if self.subnet.prefixlen != 30 or not self.subnet.subnet_of(BENCHMARKING):
            raise ValueError(f"{subnet} is not a /30 inside {BENCHMARKING}")
        self.name, self.veth, self.resolv_conf = name, f"v{name}", resolv_conf
        self.host_ip, self.pod_ip = str(self.subnet[1]), str(self.subnet[2])
        self._made_etc_netns = False

    def up(self) -> NetnsPod:
        """Creates the namespace, the veth pair and the addresses, and writes the pod's resolv.conf."""
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.veth)
            _ip("link", "set", self.veth, "up")
            _ip("-n", self.name, "addr", "add", f"{self.pod_ip}/30", "dev", "eth0")
            _ip("-n", self.name, "link", "set", "eth0", "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
            if self.resolv_conf is not None:
                self._made_etc_netns = not ETC_NETNS.exists()
                (ETC_NETNS / self.name).mkdir(parents=True)
                (ETC_NETNS / self.name / "resolv.conf").write_text(self.resolv_conf)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Removes what `up` made (safe to call twice); raises if something is still there afterwards."""
        _ip("netns", "del", self.name, check=False)
        _ip("link", "del", self.veth, check=False)
        shutil.rmtree(ETC_NETNS / self.name, ignore_errors=True)
        if self._made_etc_netns and ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
            ETC_NETNS.rmdir()
        left = [
            what
            for what, there in (
                (f"netns {self.name}", self.name in _ip("netns", "list").stdout.split()),
                (f"link {self.veth}", _ip("link", "show", self.veth, check=False).returncode == 0),
                (f"{ETC_NETNS / self.name}", (ETC_NETNS / self.name).exists()),
            )
            if there
        ]
        if left:
            raise RuntimeError(f"clean-up left {', '.join(left)}")

    def run(
        self,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        serviceaccount: str | Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        """Runs `argv` in the pod (its network and resolv.conf), optionally with `serviceaccount` mounted."""
        command = ["ip", "netns", "exec", self.name]
        if serviceaccount is not None:
            run = Path(os.path.realpath("/var/run"))  # /run here; the tmpfs keeps the host's /run out of sight
            mount = run / Path(SERVICEACCOUNT_MOUNT).relative_to("/var/run")
            script = _MOUNT_SERVICEACCOUNT.format(run=run, mount=mount)
            command += [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "pod",
                str(serviceaccount),
            ]
        return subprocess.run(command + list(argv), env=env, capture_output=True, text=True, timeout=timeout)

    def __enter__(self) -> NetnsPod:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
