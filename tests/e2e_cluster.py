"""The pieces of `make e2e`: pods that are containers of the real image on a Docker network, and a cluster to run in.

- `docker_network()`: the Docker network whose gateway is this machine's address in 198.18.0.0/15 (the default
  bridge of the engine `make image` starts; else a user network made here in 198.18.42.0/24).
- `StandInCluster` (tests/standins) on that gateway: the Kubernetes API over HTTPS, cluster DNS on port 53, and the
  service-account files.
- `pod_image(...)`: a thin test-only layer `FROM` the real image with what the kubelet gives every pod (the
  service-account files and `KUBERNETES_SERVICE_HOST/PORT`); the real image never holds them.
- `docker_runner(...)`: kfp.local's DockerRunner with the pods' resolver settings; each container's host name is
  its pod name and /etc/hosts maps it to the container's IP, as in a pod.
- `Kubelet(...)`: what the kubelet reports when a container ends: its pod's phase becomes Failed (or Succeeded), so
  the pod leaves its Service's endpoints, as a lost pod does.
- `apply_secrets_as_env(...)`: what KFP's driver and the kubelet do with a task's `secretAsEnv` (kfp.local ignores the
  platform spec): each Secret key read from the API stand-in over HTTPS becomes that task's environment variable.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.standins.cluster import StandInCluster, search_domains
from tests.standins.incluster import SERVICEACCOUNT_MOUNT

ALLOWED = ipaddress.ip_network("198.18.0.0/15")
OWN_NETWORK = ("kfp-tf-e2e", "198.18.42.0/24", "198.18.42.1")
NAMESPACE = "kubeflow-user-e2e"
API_PORT = 6443
WORKFLOW = "mnist-multiworker-e2e01"


def docker_network(client: Any) -> tuple[str, str]:
    """(network name, gateway address) of a Docker network inside 198.18.0.0/15."""
    bridge = client.networks.get("bridge")
    gateways = [c.get("Gateway") for c in bridge.attrs["IPAM"]["Config"] if c.get("Gateway")]
    if gateways and ipaddress.ip_address(gateways[0]) in ALLOWED:
        return "bridge", gateways[0]
    import docker

    name, subnet, gateway = OWN_NETWORK
    try:
        client.networks.get(name)
    except docker.errors.NotFound:
        client.networks.create(
            name,
            driver="bridge",
            ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet, gateway=gateway)]),
        )
    return name, gateway


def start_cluster(directory: Path, gateway: str) -> StandInCluster:
    """The stand-in cluster on the gateway, with the run's Argo Workflow (whose name Argo puts on every pod)."""
    cluster = StandInCluster.start(
        directory,
        gateway,
        namespace=NAMESPACE,
        api_port=API_PORT,
        dns_port=53,
        pod_labels={"workflows.argoproj.io/workflow": WORKFLOW},
    )
    cluster.api.add(
        "workflows.argoproj.io",
        NAMESPACE,
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": WORKFLOW}},
    )
    return cluster


def pod_image(client: Any, base: str, cluster: StandInCluster) -> str:
    """Builds the test-only layer on `base`: the service-account files and the API's address, as a kubelet gives."""
    import shutil

    tag = f"{base.rsplit(':', 1)[0]}-e2e-pod:{int(time.time())}"
    with tempfile.TemporaryDirectory() as context:
        shutil.copytree(cluster.files.serviceaccount, Path(context) / "serviceaccount")
        env = " ".join(f"{k}={v}" for k, v in cluster.files.env(cluster.https.port).items())
        (Path(context) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY serviceaccount/ {SERVICEACCOUNT_MOUNT}/\nENV {env}\n"
        )
        client.images.build(path=context, tag=tag, rm=True)
    return tag


def docker_runner(network: str, cluster: StandInCluster) -> Any:
    """kfp.local's DockerRunner whose containers resolve names through the stand-in's DNS like a pod."""
    from kfp import local

    return local.DockerRunner(
        network_mode=network,
        dns=[cluster.files.host],
        dns_opt=["ndots:5"],
        dns_search=search_domains(NAMESPACE, cluster.api.cluster_domain),
    )


def pipeline_root() -> Path:
    """A fresh pipeline root the containers' user (uid 1000) can write; kfp.local mounts it at the same path."""
    root = Path(tempfile.mkdtemp(prefix="kfp-tf-e2e-"))
    os.chmod(root, 0o1777)
    return root


def training_containers(
    client: Any, image: str, step: str = "train_worker", joined: str = "this is worker {index} "
) -> dict[int, Any]:
    """The running containers of `image` running `step`, by worker index (their logs say `joined` once they joined).

    The trainer's workers by default; a command-mode job's tasks with `step="run_command"` and
    `joined="worker {index} runs "`.
    """
    found = {}
    for container in client.containers.list(filters={"ancestor": image}):
        if step not in " ".join(container.attrs["Args"]):
            continue
        logs = container.logs().decode(errors="replace")
        for index in (0, 1):
            if joined.format(index=index) in logs:
                found[index] = container
    return found


class Kubelet:
    """Marks the stand-in pod of every container of `image` that ends as Failed (exit code != 0) or Succeeded.

    A container's pod is named by its host name, the container id's first 12 characters (the name the stand-in
    API learns when the container reads or patches its own pod).
    """

    def __init__(self, client: Any, image: str, cluster: StandInCluster) -> None:
        self._client, self._image, self._cluster = client, image, cluster
        self._events = client.events(decode=True, filters={"type": "container", "event": "die"})
        self._thread = threading.Thread(target=self._watch, name="kubelet", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        for event in self._events:
            attributes = event.get("Actor", {}).get("Attributes", {})
            if attributes.get("image") != self._image:
                continue
            pod = event["id"][:12]
            phase = "Succeeded" if attributes.get("exitCode") == "0" else "Failed"
            current = self._cluster.api.get("pods", NAMESPACE, pod)
            if current is not None:
                self._cluster.api.set_status("pods", NAMESPACE, pod, {**current.get("status", {}), "phase": phase})

    def stop(self) -> None:
        """Stops watching."""
        self._events.close()


def apply_secrets_as_env(pipeline: Any, cluster: StandInCluster, namespace: str = NAMESPACE) -> dict[str, list[str]]:
    """Gives each task of `pipeline` the environment its compiled `secretAsEnv` asks for, as a cluster would.

    KFP's driver (backend/src/v2/driver/k8s.go) turns every `secretAsEnv` entry of a task's Kubernetes executor config
    into `env[].valueFrom.secretKeyRef` of the task's container (the name from `secretNameParameter`, else
    `secretName`), and the kubelet reads the Secret from the API when it starts the container. kfp.local ignores the
    platform spec, so this does both before the run: it reads each Secret from the stand-in API with the Kubernetes
    client (HTTPS, in-cluster configuration) and adds its keys as plain `env` of that executor's container in the
    in-memory pipeline spec, which kfp.local's DockerRunner passes to the container. Nothing is written to disk.

    Args:
        pipeline: a compiled pipeline (its `pipeline_spec` is changed in place).
        cluster: the stand-in cluster holding the Secrets.
        namespace: the run's namespace.

    Returns:
        The environment variable names given, by executor label.

    Raises:
        LookupError: a Secret or key that is not optional is missing (a pod would not start:
            CreateContainerConfigError).
        ValueError: a secret name that is a pipeline parameter (the driver resolves it at run time; not done here).
    """
    from google.protobuf import json_format
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    api = k8s.CoreV1Api(k8s.ApiClient(cluster.files.configuration(cluster.https.port)))
    platform = json_format.MessageToDict(pipeline.platform_spec)
    executors = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
    given: dict[str, list[str]] = {}
    for label, config in executors.items():
        for entry in config.get("secretAsEnv", []):
            runtime = entry.get("secretNameParameter", {}).get("runtimeValue")
            if "secretNameParameter" in entry and runtime is None:
                raise ValueError(f"{label}: a secret name from a pipeline parameter is not resolved here")
            name = runtime["constant"] if runtime else entry["secretName"]
            try:
                data = api.read_namespaced_secret(name, namespace).data or {}
            except ApiException as err:
                if err.status == 404 and entry.get("optional"):
                    continue
                raise LookupError(f"{label}: Secret {namespace}/{name}: {err.status} {err.reason}") from None
            container = pipeline.pipeline_spec.deployment_spec["executors"][label]["container"]
            for pair in entry.get("keyToEnv", []):
                if pair["secretKey"] not in data:
                    if entry.get("optional"):
                        continue
                    raise LookupError(f"{label}: Secret {namespace}/{name} has no key {pair['secretKey']!r}")
                value = base64.b64decode(data[pair["secretKey"]]).decode()
                container.get_or_create_list("env").add_struct().update({"name": pair["envVar"], "value": value})
                given.setdefault(label, []).append(pair["envVar"])
    return given
