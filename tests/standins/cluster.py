"""The whole stand-in cluster on one host address: the API over HTTPS, cluster DNS, and a pod's in-cluster files.

For an end-to-end test whose pods are containers (or network namespaces): start it on an address the pods reach
(the Docker network's gateway, a netns veth), then give each pod `pod_env(...)`, the service-account directory
and the resolver settings; `docker_args(...)` spells them as `docker run` flags.

    cluster = StandInCluster.start(tmp_path / "cluster", "198.19.255.1")   # DNS on port 53 needs root
    ...docker run $(cluster.docker_args("train-worker-0")) IMAGE ...
    cluster.stop()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.standins.dns import DnsServer
from tests.standins.incluster import SERVICEACCOUNT_MOUNT, InCluster, make_incluster
from tests.standins.kube import KubeStandIn
from tests.standins.serving import Served


def resolv_conf(nameserver: str, namespace: str = "default", domain: str = "cluster.local", ndots: int = 5) -> str:
    """The resolv.conf the kubelet writes for a pod with dnsPolicy ClusterFirst."""
    return f"search {' '.join(search_domains(namespace, domain))}\nnameserver {nameserver}\noptions ndots:{ndots}\n"


def search_domains(namespace: str = "default", domain: str = "cluster.local") -> list[str]:
    """A pod's DNS search list, most specific first."""
    return [f"{namespace}.svc.{domain}", f"svc.{domain}", domain]


@dataclass
class StandInCluster:
    """A running stand-in cluster; `api` is the shared state (Services, pods, calls), `files` the in-cluster files."""

    api: KubeStandIn
    files: InCluster
    https: Served
    dns: DnsServer

    @classmethod
    def start(
        cls,
        directory: str | Path,
        host: str,
        *,
        namespace: str = "default",
        api_port: int = 0,
        dns_port: int = 53,
        **standin_options,
    ) -> StandInCluster:
        """Writes the in-cluster files for `host` under `directory`, then serves the API and DNS on `host`.

        Args:
            directory: where the service-account directory and the server certificate go.
            host: an address of this machine that the pods reach; the certificate's IP SAN.
            namespace: the pods' namespace (their `POD_NAMESPACE` and first search domain).
            api_port: the HTTPS port (0: any free port; pods learn it from `KUBERNETES_SERVICE_PORT`).
            dns_port: 53 for pods, whose resolv.conf cannot name a port (needs root); 0 for tests that ask directly.
            **standin_options: passed to `KubeStandIn` (the token is the generated one), e.g. `role=...`.
        """
        files = make_incluster(directory, host=host, namespace=namespace)
        api = KubeStandIn(token=files.token, **standin_options)
        https = api.serve_https(host, api_port, files.server_cert, files.server_key)
        try:
            dns = DnsServer(api.dns_records, host, dns_port).start()
        except BaseException:
            https.stop()
            raise
        return cls(api, files, https, dns)

    def stop(self) -> None:
        """Stops DNS and the API server."""
        self.dns.stop()
        self.https.stop()

    def __enter__(self) -> StandInCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def pod_env(self, pod_name: str) -> dict[str, str]:
        """What Kubernetes and the pipeline's downward-API fields put in a worker pod's environment."""
        return {**self.files.env(self.https.port), "POD_NAME": pod_name, "POD_NAMESPACE": self.files.namespace}

    def resolv_conf(self) -> str:
        """A pod's /etc/resolv.conf pointing at this cluster's DNS."""
        return resolv_conf(self.files.host, self.files.namespace, self.api.cluster_domain)

    def docker_args(self, pod_name: str) -> list[str]:
        """`docker run` flags that make a container this cluster's pod `pod_name` (DNS, search path, account, env)."""
        args = [
            "--dns",
            self.files.host,
            "--dns-opt",
            "ndots:5",
            "--mount",
            f"type=bind,src={self.files.serviceaccount},dst={SERVICEACCOUNT_MOUNT},readonly",
        ]
        for domain in search_domains(self.files.namespace, self.api.cluster_domain):
            args += ["--dns-search", domain]
        for name, value in self.pod_env(pod_name).items():
            args += ["--env", f"{name}={value}"]
        return args
