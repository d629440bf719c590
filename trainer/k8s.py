"""Peer discovery on Kubernetes: one headless Service per worker, named from the run, selecting that worker's pod.

KFP pods have no stable names, so `create_cluster` creates a Service per worker whose selector matches labels
the worker puts on its own pod when it starts. The Service's DNS name is the worker's address in TF_CONFIG and
stays the same when KFP retries that worker. Every object carries the run's labels, so the exit handler can
list and delete them together. Uses the `kubernetes` client (in-cluster config in a pod); no TensorFlow.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from typing import Any

from trainer.cluster import split_address, task_order
from trainer.config import MAX_WORKERS
from trainer.errors import KubernetesError, PeerUnavailableError, UsageError

log = logging.getLogger(__name__)

APP = "kfp-tf-multiworker"
RUN_LABEL = "tf-multiworker.kubeflow.org/run"
INDEX_LABEL = "tf-multiworker.kubeflow.org/worker-index"
RUN_ID_LABEL = "pipelines.kubeflow.org/run-id"
DEFAULT_PORT = 2222
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def run_key(run_id: str) -> str:
    """A short DNS-safe key for a run: `r` + 10 hex digits of its SHA-1 (unique per run, stable across retries)."""
    if not run_id:
        raise UsageError("run id is empty; the pipeline passes dsl.PIPELINE_JOB_ID_PLACEHOLDER")
    return "r" + hashlib.sha1(run_id.encode()).hexdigest()[:10]


def service_name(run_id: str, index: int) -> str:
    """`tfw-<run key>-<index>`: a DNS-1035 label of at most 20 characters."""
    return f"tfw-{run_key(run_id)}-{index}"


def worker_addresses(run_id: str, num_workers: int, namespace: str, port: int = DEFAULT_PORT) -> list[str]:
    """The TF_CONFIG addresses of the run's workers: each Service's in-cluster DNS name and the gRPC port."""
    check_workers(num_workers)
    check_port(port)
    return [f"{service_name(run_id, i)}.{namespace}.svc:{port}" for i in range(num_workers)]


def namespace() -> str:
    """This pod's namespace: `POD_NAMESPACE` (downward API), else the service account's namespace file."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip()
    except OSError:
        raise UsageError("POD_NAMESPACE is not set and this is not a pod (no service-account namespace file); "
                         "the pipeline sets it through the downward API (metadata.namespace)") from None


def pod_name() -> str:
    """This pod's name: `POD_NAME` (downward API), else the host name, which Kubernetes sets to the pod's name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def control_address(address: str) -> str:
    """The supervisor's control address beside a task's TF address: the same host, the next port."""
    host, port = split_address(address)
    return f"{host}:{port + 1}"


def check_workers(num_workers: int) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or not 1 <= num_workers <= MAX_WORKERS:
        raise UsageError(f"num_workers {num_workers!r} is not allowed; allowed: 1 to {MAX_WORKERS}")


def check_port(port: int) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65534:
        raise UsageError(f"port {port!r} is not allowed; allowed: an integer from 1 to 65534 (the next port is the "
                         "supervisor's control port)")


def run_labels(run_id: str) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/component": "tf-worker",
        "app.kubernetes.io/managed-by": "kubeflow-pipelines",
        RUN_LABEL: run_key(run_id),
    }
    if _LABEL_VALUE.match(run_id) and len(run_id) <= 63:
        labels[RUN_ID_LABEL] = run_id
    return labels


def pod_labels(run_id: str, index: int) -> dict[str, str]:
    """The labels a worker puts on its own pod so that its Service selects it."""
    return {"app.kubernetes.io/name": APP, RUN_LABEL: run_key(run_id), INDEX_LABEL: str(index)}


def service_manifest(run_id: str, index: int, port: int = DEFAULT_PORT) -> dict[str, Any]:
    """The headless Service for one worker, as a Kubernetes manifest dict."""
    check_port(port)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(run_id, index), "labels": {**run_labels(run_id), INDEX_LABEL: str(index)}},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": pod_labels(run_id, index),
            "ports": [{"name": "tf-grpc", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def selector(run_id: str) -> str:
    return f"{RUN_LABEL}={run_key(run_id)}"


def core_api(host: str | None = None, token: str | None = None) -> Any:
    """A CoreV1Api: in-cluster config inside a pod, or `host` (and bearer `token`) when given."""
    from kubernetes import client, config

    if host:
        configuration = client.Configuration()
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        return client.CoreV1Api(client.ApiClient(configuration))
    config.load_incluster_config()
    return client.CoreV1Api()


def _explain(err: Any, verb: str, resource: str, namespace: str) -> KubernetesError:
    if err.status == 403:
        return KubernetesError(f"forbidden: the pipeline's service account may not {verb} {resource} in namespace "
                               f"{namespace!r}; apply deploy/rbac-*.yaml (Role needs verb {verb!r} on {resource!r})")
    reason = (err.reason or "").strip()
    return KubernetesError(f"{verb} {resource} in namespace {namespace!r} failed: HTTP {err.status} {reason}")


def create_services(api: Any, namespace: str, run_id: str, num_workers: int, port: int = DEFAULT_PORT) -> list[str]:
    """Creates the run's Services; one that already exists (a retried step) is kept. Returns worker addresses."""
    from kubernetes.client.exceptions import ApiException

    addresses = worker_addresses(run_id, num_workers, namespace, port)
    for index in range(num_workers):
        body = service_manifest(run_id, index, port)
        try:
            api.create_namespaced_service(namespace, body)
            log.info("created service %s", body["metadata"]["name"])
        except ApiException as err:
            if err.status != 409:
                raise _explain(err, "create", "services", namespace) from None
            log.info("service %s already exists (retried step); keeping it", body["metadata"]["name"])
    return addresses


def delete_services(api: Any, namespace: str, run_id: str) -> list[str]:
    """Deletes every Service of the run; deleting what is already gone is fine. Returns the names deleted."""
    from kubernetes.client.exceptions import ApiException

    try:
        listed = api.list_namespaced_service(namespace, label_selector=selector(run_id))
    except ApiException as err:
        raise _explain(err, "list", "services", namespace) from None
    deleted = []
    for item in listed.items:
        name = item.metadata.name
        try:
            api.delete_namespaced_service(name, namespace)
            deleted.append(name)
        except ApiException as err:
            if err.status != 404:
                raise _explain(err, "delete", "services", namespace) from None
    log.info("deleted %d service(s) of run %s", len(deleted), run_id)
    return deleted


def label_own_pod(api: Any, namespace: str, pod_name: str, run_id: str, index: int) -> None:
    """Puts this worker's labels on its own pod so that its Service selects it."""
    from kubernetes.client.exceptions import ApiException

    if not pod_name:
        raise UsageError("the pod name is empty; the worker op sets POD_NAME through the downward API (metadata.name)")
    try:
        api.patch_namespaced_pod(pod_name, namespace, {"metadata": {"labels": pod_labels(run_id, index)}})
    except ApiException as err:
        raise _explain(err, "patch", "pods", namespace) from None


def wait_for_names(addresses: Sequence[str], timeout: float, interval: float = 2.0) -> None:
    """Waits until every address's host name resolves; fails naming those that never did."""
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while True:
        pending = [a for a in pending if not _resolves(split_address(a)[0])]
        if not pending:
            return
        if time.monotonic() >= deadline:
            raise PeerUnavailableError(f"peer name(s) did not resolve within {timeout:g}s: {', '.join(pending)}")
        time.sleep(interval)


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except socket.gaierror:
        return False


def flat_index(spec: dict[str, list[str]], job: str, index: int) -> int:
    """A task's position in chief + workers + ps order: the index of its Service."""
    return task_order(spec).index(spec[job][index])


def join_cluster(spec: dict[str, list[str]], job: str, index: int, run_id: str, timeout: float) -> None:
    """In a pod: label it so its Service selects it, then wait until every peer's name resolves."""
    own = spec[job][index]
    label_own_pod(core_api(), namespace(), pod_name(), run_id, flat_index(spec, job, index))
    wait_for_names([a for addresses in spec.values() for a in addresses if a != own], timeout)
