"""Joining a run's cluster on Kubernetes: a Service name per task, every name resolved, and why a peer is missing.

A task creates its Service, labels its own pod, then waits until its own name resolves to its own pod IP (TensorFlow
dials its own address too) and every peer's name resolves. While it waits it looks at the run's pods: a peer whose
pod the scheduler cannot place for longer than `unschedulable_timeout` fails the join at once, and a timeout names
each missing peer with its pod, phase and the scheduler's reason.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from trainer.cluster import topology
from trainer.cluster.topology import split_address
from trainer.core.errors import StartupTimeoutError
from trainer.k8s import objects

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0


def own_ip() -> str:
    """This pod's IP: `POD_IP` (downward API status.podIP), else what the host name resolves to (/etc/hosts)."""
    import os

    return os.environ.get("POD_IP") or socket.gethostbyname(socket.gethostname())


def resolved(host: str) -> set[str]:
    """The IPv4/IPv6 addresses `host` resolves to now (empty when it does not)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror:
        return set()


def join_cluster(
    spec: dict[str, list[str]],
    job: str,
    index: int,
    run_id: str,
    timeout: float,
    unschedulable_timeout: float,
    api: Any = None,
    resolve: Callable[[str], set[str]] = resolved,
) -> int:
    """In a pod: create this task's Service, label the pod for it, and wait until the cluster's names resolve.

    Returns:
        This task's position in the run (the index of its Service).

    Raises:
        StartupTimeoutError: a name did not resolve within `timeout`, or a peer's pod stayed unschedulable.
        KubernetesError: an API call was refused.
    """
    api = api or objects.core_api()
    namespace, pod = objects.namespace(), objects.pod_name()
    tasks = [(task.name, task.address) for task in topology.tasks(spec)]
    position = [address for _, address in tasks].index(spec[job][index])
    port = split_address(spec[job][index])[1]
    objects.ensure_service(api, namespace, run_id, position, port, objects.workflow_owner(api, namespace, pod))
    objects.label_own_pod(api, namespace, pod, run_id, position)
    wait_for_names(api, namespace, run_id, tasks, position, own_ip(), timeout, unschedulable_timeout, resolve)
    return position


def leave_cluster(run_id: str, position: int, api: Any = None) -> None:
    """Deletes this task's Service when its step ends.

    A failure to do so is logged, not raised: the run's Workflow owns the Service and removes it with the run.
    """
    from trainer.core.errors import KubernetesError

    try:
        objects.delete_service(api or objects.core_api(), objects.namespace(), run_id, position)
    except KubernetesError as err:
        log.warning("could not delete this task's Service: %s", err)


def wait_for_names(
    api: Any,
    namespace: str,
    run_id: str,
    tasks: Sequence[tuple[str, str]],
    position: int,
    ip: str,
    timeout: float,
    unschedulable_timeout: float,
    resolve: Callable[[str], set[str]] = resolved,
) -> None:
    """Waits until this task's name resolves to `ip` and every peer's name resolves (see the module docstring)."""
    started = time.monotonic()
    while True:
        missing = [
            i
            for i, (_, address) in enumerate(tasks)
            if not _ready(resolve(split_address(address)[0]), ip if i == position else None)
        ]
        if not missing:
            return
        stuck = unschedulable_pods(api, namespace, run_id, unschedulable_timeout)
        waited = time.monotonic() - started
        if stuck or waited >= timeout:
            what = (
                f"pods of this run unschedulable for more than {unschedulable_timeout:g}s"
                if stuck
                else f"names did not resolve within {timeout:g}s"
            )
            why = describe_missing(api, namespace, run_id, tasks, missing, position, ip)
            raise StartupTimeoutError(f"cluster start-up failed, {what}: {why}")
        time.sleep(POLL_SECONDS)


def _ready(ips: set[str], own_ip: str | None) -> bool:
    return bool(ips) and (own_ip is None or own_ip in ips)


def _pods(api: Any, namespace: str, selector: str) -> list[Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return api.list_namespaced_pod(namespace, label_selector=selector).items
    except ApiException as err:
        log.warning("cannot list pods to say why a peer is missing: HTTP %s %s", err.status, (err.reason or "").strip())
        return None


def _scheduled_condition(pod: Any) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)


def _age(when: Any) -> float:
    if when is None:
        return 0.0
    if isinstance(when, str):
        when = datetime.fromisoformat(when.replace("Z", "+00:00"))
    return (datetime.now(timezone.utc) - when).total_seconds()


def unschedulable_pods(api: Any, namespace: str, run_id: str, longer_than: float) -> list[str]:
    """`"pod: Pending: <scheduler's message>"` for each pod of the run unschedulable for more than `longer_than` s."""
    found = []
    for pod in _pods(api, namespace, f"{objects.KFP_RUN_LABEL}={run_id}") or []:
        condition = _scheduled_condition(pod)
        if (
            pod.status.phase == "Pending"
            and condition
            and condition.status == "False"
            and condition.reason == "Unschedulable"
            and _age(condition.last_transition_time) > longer_than
        ):
            found.append(f"{pod.metadata.name}: Pending: {' '.join((condition.message or 'Unschedulable').split())}")
    return found


def _pod_state(pod: Any) -> str:
    condition = _scheduled_condition(pod)
    if pod.status.phase == "Pending" and condition and condition.status == "False":
        return f"Pending: {' '.join((condition.message or condition.reason or '').split())}"
    waiting = [s.state.waiting.reason for s in (pod.status.container_statuses or []) if s.state and s.state.waiting]
    return f"{pod.status.phase}" + (f" ({', '.join(waiting)})" if waiting else "")


def describe_missing(
    api: Any,
    namespace: str,
    run_id: str,
    tasks: Sequence[tuple[str, str]],
    missing: Sequence[int],
    position: int,
    ip: str,
) -> str:
    """One clause per missing name, then the run's pods that are not running.

    A clause names the task, its address, its pod (or that none has joined) and the pod's phase and reason.
    """
    joined = {
        p.metadata.labels.get(objects.INDEX_LABEL): p for p in _pods(api, namespace, objects.selector(run_id)) or []
    }
    clauses = []
    for i in missing:
        name, address = tasks[i]
        if i == position:
            clauses.append(f"{name} (this pod) at {address}: the name does not resolve to this pod's IP {ip} yet")
        elif str(i) in joined:
            pod = joined[str(i)]
            clauses.append(
                f"{name} at {address}: pod {pod.metadata.name} {_pod_state(pod)}, the name does not resolve yet"
            )
        else:
            clauses.append(f"{name} at {address}: no pod has joined yet")
    others = [
        p for p in _pods(api, namespace, f"{objects.KFP_RUN_LABEL}={run_id}") or [] if p.status.phase == "Pending"
    ]
    if others:
        clauses.append(
            "pods of this run not running: " + "; ".join(f"{p.metadata.name} {_pod_state(p)}" for p in others)
        )
    return "; ".join(clauses)
