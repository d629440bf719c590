"""What a pod needs for `kubernetes.config.load_incluster_config()` against the HTTPS API stand-in.

`make_incluster` writes a service-account directory (`token` with no trailing newline, `ca.crt`, `namespace`), to
be mounted read-only at `SERVICEACCOUNT_MOUNT` in a pod, and a server certificate and key for the stand-in,
signed by that CA, with an IP SAN equal to `KUBERNETES_SERVICE_HOST` (the client always connects to
`https://HOST:PORT` and verifies the certificate). Certificates come from trustme; no openssl subprocess.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

import trustme

SERVICEACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class InCluster:
    """The files of one stand-in cluster. `serviceaccount` holds what a pod mounts; `server_*` stay on the host."""

    host: str
    namespace: str
    token: str
    serviceaccount: Path
    server_cert: Path
    server_key: Path

    @property
    def token_file(self) -> Path:
        return self.serviceaccount / "token"

    @property
    def ca_file(self) -> Path:
        return self.serviceaccount / "ca.crt"

    def env(self, port: int) -> dict[str, str]:
        """The variables Kubernetes sets in every pod, for an API stand-in listening on (host, port)."""
        return {"KUBERNETES_SERVICE_HOST": self.host, "KUBERNETES_SERVICE_PORT": str(port)}

    def configuration(self, port: int):
        """A `kubernetes.client.Configuration` made by the client's own in-cluster loader from these files."""
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader

        configuration = client.Configuration()
        InClusterConfigLoader(
            token_filename=str(self.token_file), cert_filename=str(self.ca_file), environ=self.env(port)
        ).load_and_set(configuration)
        return configuration


def make_incluster(
    directory: str | Path, host: str = "127.0.0.1", namespace: str = "default", token: str | None = None
) -> InCluster:
    """Writes a fresh CA, service-account files and a server certificate for `host` under `directory`.

    Args:
        directory: created if missing; gets `serviceaccount/` (mode 755, files 644, readable by a non-root pod
            user) and `server/` (the key is 600).
        host: the address the API stand-in listens on and pods reach it by (an IP: it becomes the IP SAN).
        namespace: written to `serviceaccount/namespace`.
        token: the bearer token; a random one when None. Must not end with a newline.

    Returns:
        The paths and values, and `env(port)` for the pod's environment.
    """
    token = token if token is not None else secrets.token_urlsafe(32)
    if not token or token != token.strip():
        raise ValueError("the token must be non-empty without surrounding whitespace: the client sends it verbatim")
    directory = Path(directory)
    account, server = directory / "serviceaccount", directory / "server"
    for path in (account, server):
        path.mkdir(parents=True, exist_ok=True)
    account.chmod(0o755)
    server.chmod(0o700)
    ca = trustme.CA(organization_name="kfp-tf-multiworker stand-in cluster")
    leaf = ca.issue_cert(
        host,
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        common_name="kube-apiserver",
    )
    (account / "token").write_text(token)
    ca.cert_pem.write_to_path(str(account / "ca.crt"))
    (account / "namespace").write_text(namespace)
    for name in ("token", "ca.crt", "namespace"):
        (account / name).chmod(0o644)
    cert, key = server / "tls.crt", server / "tls.key"
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(key))
    key.chmod(0o600)
    return InCluster(host, namespace, token, account, cert, key)
