"""What the pipeline's pods get on a cluster: no Istio sidecar; the training pods also resources, labels, retry.

kfp.local ignores all of it; the compiled YAML carries it (the Kubernetes platform spec and the container resources).
"""

import dataclasses
from typing import Any

from kfp import kubernetes

from trainer.core.errors import UsageError
from trainer.k8s import quantity
from trainer.k8s.objects import APP

# A lost pod's replacement is what its peers wait for (they restart in place at once), so it is retried soon.
RETRY_BACKOFF = "10s"
# Istio decides by this label (its `sidecar.istio.io/inject` annotation is deprecated, and reported ignored by
# OpenShift Service Mesh 3); a sidecar would sit between the workers' TF gRPC connections. KFP adds the annotation.
NO_SIDECAR = ("sidecar.istio.io/inject", "false")
# The training pods carry the project's name from their creation (they add their run and index when they join), so
# that deploy/networkpolicy.yaml can let them reach each other in namespaces that deny by default.
TRAINING = ("app.kubernetes.io/name", APP)


@dataclasses.dataclass(frozen=True)
class PodSettings:
    """Compile-time settings of the training pods (workers, chief, parameter servers).

    Attributes:
        cpu_request: CPU the scheduler reserves per training pod (empty: none).
        cpu_limit: CPU a training pod may use (empty: no limit).
        memory_request: memory the scheduler reserves per training pod (empty: none).
        memory_limit: memory a training pod may use before it is OOM-killed (empty: no limit).
        gpus: NVIDIA GPUs per training pod; the image is CPU-only, so only 0 is allowed.
        retries: KFP retries of a training pod that failed as a whole (the pod was lost); restarts after a lost
            peer happen in place (`max_restarts`). KFP has no exit-code policy, so these retry any failure.
        timeout_seconds: a training pod running longer than this is stopped (Kubernetes' activeDeadlineSeconds);
            0, the default: no timeout, so a long training is never cut by a limit it did not choose.
    """

    cpu_request: str = "1"
    cpu_limit: str = "2"
    memory_request: str = "2Gi"
    memory_limit: str = "4Gi"
    gpus: int = 0
    retries: int = 1
    timeout_seconds: int = 0

    def __post_init__(self) -> None:
        for kind, form in (("cpu", quantity.cpu), ("memory", quantity.memory)):
            request, limit = getattr(self, f"{kind}_request"), getattr(self, f"{kind}_limit")
            for name, value in ((f"{kind}_request", request), (f"{kind}_limit", limit)):
                if value:
                    object.__setattr__(self, name, form(value, name))
            if request and limit and quantity.parse(request, "") > quantity.parse(limit, ""):
                raise UsageError(
                    f"{kind}_request {request!r} is above {kind}_limit {limit!r}; Kubernetes rejects such a pod; "
                    "allowed: a request at most the limit"
                )
        if self.gpus:
            raise UsageError(
                f"gpus {self.gpus} is not allowed; allowed: 0. The image installs the CPU build of "
                "TensorFlow from PyPI and no CUDA libraries, so a GPU pod would train on its CPU: build a "
                "GPU image (tensorflow[and-cuda]==2.21.0 on an NVIDIA CUDA base) first, see docs/cluster.md"
            )
        if not 0 <= self.retries <= 10:
            raise UsageError(f"retries {self.retries} is not allowed; allowed: 0 to 10")
        if self.timeout_seconds < 0:
            raise UsageError(
                f"timeout {self.timeout_seconds}s is not allowed; allowed: 0 (none) or a number of seconds"
            )


def step(task: Any, name: str, cache: bool = False) -> Any:
    """Every pod of the pipeline: its display name, whether KFP may cache it, and no Istio sidecar (the label)."""
    kubernetes.add_pod_label(task, *NO_SIDECAR)
    return task.set_display_name(name).set_caching_options(cache)


def with_namespace(task: Any) -> Any:
    """The pod's namespace as POD_NAMESPACE (downward API): the Services are created and deleted there."""
    return kubernetes.use_field_path_as_env(task, env_name="POD_NAMESPACE", field_path="metadata.namespace")


def training_pod(task: Any, pods: PodSettings) -> Any:
    """A training task's pod: its name and namespace from the downward API, its label, resources, retry, timeout."""
    kubernetes.add_pod_label(task, *TRAINING)
    with_namespace(task)
    kubernetes.use_field_path_as_env(task, env_name="POD_NAME", field_path="metadata.name")
    kubernetes.use_field_path_as_env(task, env_name="POD_IP", field_path="status.podIP")
    for value, setter in (
        (pods.cpu_request, task.set_cpu_request),
        (pods.cpu_limit, task.set_cpu_limit),
        (pods.memory_request, task.set_memory_request),
        (pods.memory_limit, task.set_memory_limit),
    ):
        if value:
            setter(value)
    if pods.retries:
        task.set_retry(num_retries=pods.retries, backoff_duration=RETRY_BACKOFF, backoff_factor=2.0)
    if pods.timeout_seconds:
        kubernetes.set_timeout(task, pods.timeout_seconds)
    return task
