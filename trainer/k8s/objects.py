"""Kubernetes objects of a run: one headless Service per training task, named from the run, owned by the run.

KFP pods have no stable names, so every task has a Service named `tfw-<run key>-<index>` whose selector matches
labels the task puts on its own pod when it starts; the Service's DNS name is the task's address in TF_CONFIG and
stays the same when KFP retries that task. Each task creates its own Service when it joins (a missing one, after a
KFP Retry of a failed run, comes back), and deletes it when its step ends. Each Service carries an
ownerReference to the run's Argo Workflow, so deleting the run (or its TTL) removes whatever a killed pod left.
Uses the `kubernetes` client (in-cluster config in a pod); no TensorFlow.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from typing import Any

from trainer.config import settings
from trainer.config.checks import int_between, require
from trainer.config.contract import MAX_WORKERS
from trainer.core.errors import KubernetesError, UsageError
from trainer.core.runs import run_key

log = logging.getLogger(__name__)

APP = "kfp-tf-multiworker"
RUN_LABEL = "tf-multiworker.kubeflow.org/run"
INDEX_LABEL = "tf-multiworker.kubeflow.org/worker-index"
RUN_ID_LABEL = "pipelines.kubeflow.org/run-id"
KFP_RUN_LABEL = "pipeline/runid"
WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
WORKFLOW = ("argoproj.io", "v1alpha1", "workflows", "Workflow")
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# What Kubernetes accepts as a label key (an optional DNS-subdomain prefix and a name of at most 63 characters) and
# value (empty, or at most 63 characters beginning and ending alphanumeric), and the effects of a node taint.
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def is_label_key(key: str) -> bool:
    """Whether Kubernetes accepts `key` as a label key (and so as a node selector's key)."""
    return bool(_LABEL_KEY.match(key))


def is_label_value(value: str) -> bool:
    """Whether Kubernetes accepts `value` as a label value."""
    return bool(_LABEL_VALUE.match(value))


def service_name(run_id: str, index: int) -> str:
    """`tfw-<run key>-<index>`: a DNS-1035 label of at most 20 characters."""
    return f"tfw-{run_key(run_id)}-{index}"


def task_addresses(run_id: str, tasks: int, namespace: str, port: int | None = None) -> list[str]:
    """The TF_CONFIG addresses of the run's tasks: each Service's DNS name and the port (the contract's by default)."""
    require("tasks", tasks, int_between(1, MAX_WORKERS))
    port = settings.default("port") if port is None else port
    settings.check("port", port)
    return [f"{service_name(run_id, i)}.{namespace}.svc:{port}" for i in range(tasks)]


def namespace() -> str:
    """This pod's namespace: `POD_NAMESPACE` (downward API), else the service account's namespace file."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip()
    except OSError:
        raise UsageError(
            "POD_NAMESPACE is not set and this is not a pod (no service-account namespace file); "
            "the pipeline sets it through the downward API (metadata.namespace)"
        ) from None


def namespace_if_pod() -> str | None:
    """This pod's namespace, or None outside a pod (kfp.local, the CLIs)."""
    try:
        return namespace()
    except UsageError:
        return None


def pod_name() -> str:
    """This pod's name: `POD_NAME` (downward API), else the host name, which Kubernetes sets to the pod's name."""
    return os.environ.get("POD_NAME") or socket.gethostname()


def run_labels(run_id: str) -> dict[str, str]:
    """The labels of every object of the run (its Services)."""
    labels = {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/component": "tf-worker",
        "app.kubernetes.io/managed-by": "kubeflow-pipelines",
        RUN_LABEL: run_key(run_id),
    }
    if is_label_value(run_id):
        labels[RUN_ID_LABEL] = run_id
    return labels


def pod_labels(run_id: str, index: int) -> dict[str, str]:
    """The labels a task puts on its own pod so that its Service selects it."""
    return {"app.kubernetes.io/name": APP, RUN_LABEL: run_key(run_id), INDEX_LABEL: str(index)}


def service_manifest(
    run_id: str, index: int, port: int | None = None, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The headless Service for one task, as a Kubernetes manifest dict (owned by `owner` when given)."""
    port = settings.default("port") if port is None else port
    settings.check("port", port)
    metadata: dict[str, Any] = {
        "name": service_name(run_id, index),
        "labels": {**run_labels(run_id), INDEX_LABEL: str(index)},
    }
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": pod_labels(run_id, index),
            "ports": [{"name": "tf-grpc", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def selector(run_id: str) -> str:
    """The label selector of the run's objects."""
    return f"{RUN_LABEL}={run_key(run_id)}"


def core_api(host: str | None = None, token: str | None = None) -> Any:
    """A CoreV1Api: `host` (and bearer `token`) when given, in-cluster config in a pod, else `$KUBECONFIG`."""
    from kubernetes import client, config

    if host:
        configuration = client.Configuration()
        configuration.host = host
        if token:
            configuration.api_key = {"authorization": f"Bearer {token}"}
        return client.CoreV1Api(client.ApiClient(configuration))
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
    else:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)  # read now, not at import
    return client.CoreV1Api()


def custom_objects_api() -> Any:
    """A CustomObjectsApi over the connection `core_api()` makes (for custom resources such as KServe's)."""
    from kubernetes import client

    return client.CustomObjectsApi(core_api().api_client)


def explain(err: Any, verb: str, resource: str, namespace: str) -> KubernetesError:
    """One line for a refused API call: what the service account may not do, or the status and its reason."""
    if err.status == 403:
        return KubernetesError(
            f"forbidden: the pipeline's service account may not {verb} {resource} in namespace "
            f"{namespace!r}; grant it (deploy/rbac-*.yaml: verb {verb!r} on {resource!r})"
        )
    reason = (err.reason or "").strip()
    return KubernetesError(f"{verb} {resource} in namespace {namespace!r} failed: HTTP {err.status} {reason}")


def workflow_owner(api: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    """An ownerReference to the Argo Workflow that runs this pod (its `workflows.argoproj.io/workflow` label).

    Returns None, with a warning, when the pod has no such label or the Workflow cannot be read: the Service is
    then removed only by its task or by hand (`kubectl delete svc -l tf-multiworker.kubeflow.org/run`).
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        labels = api.read_namespaced_pod(pod, namespace).metadata.labels or {}
        name = labels.get(WORKFLOW_LABEL)
        if not name:
            log.warning("pod %s has no %s label; its Service will not be owned by the run", pod, WORKFLOW_LABEL)
            return None
        group, version, plural, kind = WORKFLOW
        workflow = client.CustomObjectsApi(api.api_client).get_namespaced_custom_object(
            group, version, namespace, plural, name
        )
    except ApiException as err:
        log.warning(
            "cannot find the run's Workflow for pod %s (HTTP %s %s); its Service will not be owned by the run",
            pod,
            err.status,
            (err.reason or "").strip(),
        )
        return None
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "name": name,
        "uid": workflow["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }


def ensure_service(api: Any, namespace: str, run_id: str, index: int, port: int, owner: dict[str, Any] | None) -> bool:
    """Creates this task's Service unless it exists (a retried task keeps it). Returns whether it was created."""
    from kubernetes.client.exceptions import ApiException

    body = service_manifest(run_id, index, port, owner)
    try:
        api.create_namespaced_service(namespace, body)
    except ApiException as err:
        if err.status != 409:
            raise explain(err, "create", "services", namespace) from None
        return False
    log.info("created service %s", body["metadata"]["name"])
    return True


def delete_service(api: Any, namespace: str, run_id: str, index: int) -> bool:
    """Deletes this task's Service; one already gone is fine. Returns whether it was there."""
    from kubernetes.client.exceptions import ApiException

    try:
        api.delete_namespaced_service(service_name(run_id, index), namespace)
    except ApiException as err:
        if err.status != 404:
            raise explain(err, "delete", "services", namespace) from None
        return False
    log.info("deleted service %s", service_name(run_id, index))
    return True


def label_own_pod(api: Any, namespace: str, pod: str, run_id: str, index: int) -> None:
    """Puts this task's labels on its own pod so that its Service selects it."""
    from kubernetes.client.exceptions import ApiException

    if not pod:
        raise UsageError(
            "the pod name is empty; the training op sets POD_NAME through the downward API (metadata.name)"
        )
    try:
        api.patch_namespaced_pod(pod, namespace, {"metadata": {"labels": pod_labels(run_id, index)}})
    except ApiException as err:
        raise explain(err, "patch", "pods", namespace) from None
