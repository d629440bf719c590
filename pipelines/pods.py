"""What the pipeline's pods get on a cluster: no Istio sidecar; the training pods also resources, labels, retry, GPUs.

kfp.local ignores all of it; the compiled YAML carries it (the Kubernetes platform spec and the container resources).
"""

import dataclasses
from typing import Any

from kfp import kubernetes

from trainer.command.tfjob_spec import ACCELERATORS
from trainer.core import quantity
from trainer.core.errors import UsageError
from trainer.k8s.objects import APP, TAINT_EFFECTS, is_label_key, is_label_value

# A lost pod's replacement is what its peers wait for (they restart in place at once), so it is retried soon.
RETRY_BACKOFF = "10s"
# Istio decides by this label (its `sidecar.istio.io/inject` annotation is deprecated, and reported ignored by
# OpenShift Service Mesh 3); a sidecar would sit between the workers' TF gRPC connections. KFP adds the annotation.
NO_SIDECAR = ("sidecar.istio.io/inject", "false")
# The training pods carry the project's name from their creation (they add their run and index when they join), so
# that deploy/networkpolicy.yaml can let them reach each other in namespaces that deny by default.
TRAINING = ("app.kubernetes.io/name", APP)
MAX_GPUS = 16
GPU_TAG_SUFFIX = "-gpu"


@dataclasses.dataclass(frozen=True)
class PodSettings:
    """Compile-time settings of the training pods (workers, chief, parameter servers).

    Attributes:
        cpu_request: CPU the scheduler reserves per training pod (empty: none).
        cpu_limit: CPU a training pod may use (empty: no limit).
        memory_request: memory the scheduler reserves per training pod (empty: none).
        memory_limit: memory a training pod may use before it is OOM-killed (empty: no limit).
        gpus: GPUs per training pod (0 to 16; 0: none); with GPUs the training tasks run gpu_image (docs/gpus.md).
        accelerator: the GPUs' Kubernetes resource name: nvidia.com/gpu or amd.com/gpu.
        gpu_image: the image the training tasks run when gpus is above 0 (empty: the image's tag with -gpu
            appended, REPO:TAG -> REPO:TAG-gpu); the other steps keep the CPU image.
        gpu_node_selector: with gpus: node labels the training pods must match, KEY=VALUE[,KEY=VALUE...], e.g.
            cloud.google.com/gke-accelerator=nvidia-tesla-t4 (empty: none).
        gpu_tolerations: with gpus: taints of the GPU nodes the training pods tolerate, KEY[=VALUE][:EFFECT][,...]
            (no value: operator Exists; no effect: every effect), e.g. nvidia.com/gpu:NoSchedule (empty: none).
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
    accelerator: str = ACCELERATORS[0]
    gpu_image: str = ""
    gpu_node_selector: str = ""
    gpu_tolerations: str = ""
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
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or not 0 <= self.gpus <= MAX_GPUS:
            raise UsageError(f"gpus {self.gpus!r} is not allowed; allowed: a whole number from 0 to {MAX_GPUS}")
        if self.accelerator not in ACCELERATORS:
            raise UsageError(f"accelerator {self.accelerator!r} is not allowed; allowed: {', '.join(ACCELERATORS)}")
        node_selector, tolerations = self.node_selector(), self.tolerations()
        if not self.gpus:
            given = {"gpu_image": self.gpu_image, "gpu_node_selector": node_selector, "gpu_tolerations": tolerations}
            for name in (name for name, value in given.items() if value):
                raise UsageError(f"{name} {getattr(self, name)!r} is not allowed with gpus 0; allowed: gpus 1 or more")
        if not 0 <= self.retries <= 10:
            raise UsageError(f"retries {self.retries} is not allowed; allowed: 0 to 10")
        if self.timeout_seconds < 0:
            raise UsageError(
                f"timeout {self.timeout_seconds}s is not allowed; allowed: 0 (none) or a number of seconds"
            )

    def node_selector(self) -> tuple[tuple[str, str], ...]:
        """`gpu_node_selector` as (key, value) pairs, checked as Kubernetes checks label keys and values.

        Raises:
            UsageError: naming the pair that is not KEY=VALUE with a valid label key and value.
        """
        pairs = []
        for item in filter(None, (part.strip() for part in self.gpu_node_selector.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not is_label_key(key) or not is_label_value(value):
                raise UsageError(
                    f"gpu_node_selector {item!r} is not allowed; allowed: KEY=VALUE with a Kubernetes label key and "
                    "value, e.g. cloud.google.com/gke-accelerator=nvidia-tesla-t4"
                )
            pairs.append((key, value))
        return tuple(pairs)

    def tolerations(self) -> tuple[dict[str, str], ...]:
        """`gpu_tolerations` as keyword arguments of `kfp.kubernetes.add_toleration`.

        Raises:
            UsageError: naming the toleration that is not KEY[=VALUE][:EFFECT] with a known effect.
        """
        found = []
        for item in filter(None, (part.strip() for part in self.gpu_tolerations.split(","))):
            rest, _, effect = item.partition(":")
            key, sep, value = rest.partition("=")
            if not is_label_key(key) or (sep and not is_label_value(value)) or effect not in ("", *TAINT_EFFECTS):
                raise UsageError(
                    f"gpu_tolerations {item!r} is not allowed; allowed: KEY[=VALUE][:EFFECT] with EFFECT one of "
                    f"{', '.join(TAINT_EFFECTS)}, e.g. nvidia.com/gpu:NoSchedule"
                )
            toleration = {"key": key, "operator": "Equal" if sep else "Exists"}
            toleration.update({"value": value} if sep else {})
            toleration.update({"effect": effect} if effect else {})
            found.append(toleration)
        return tuple(found)

    def training_image(self, image: str) -> str:
        """The image the training tasks run: `image` without GPUs; with them gpu_image, else `gpu_tag(image)`."""
        if not self.gpus:
            return image
        return self.gpu_image or gpu_tag(image)


def gpu_tag(image: str) -> str:
    """The GPU image beside `image`: its tag with `-gpu` appended.

    `REPO:TAG` -> `REPO:TAG-gpu`; `REPO` (no tag, so `latest`) -> `REPO:latest-gpu`.

    Raises:
        UsageError: `image` is pinned by digest, which names no tag to derive from.
    """
    if "@" in image:
        raise UsageError(
            f"image {image!r} is pinned by a digest, so no GPU tag can be derived from it; allowed: pass "
            "--gpu-image REGISTRY/kfp-tf-multiworker:TAG-gpu (or its digest) with --gpus"
        )
    name, colon, tag = image.rpartition(":")
    if not colon or "/" in tag:
        return f"{image}:latest{GPU_TAG_SUFFIX}"
    return f"{name}:{tag}{GPU_TAG_SUFFIX}"


def with_accelerators(task: Any, pods: PodSettings) -> Any:
    """The task's GPUs: its accelerator type and count, and the GPU pool's node selector and tolerations."""
    if not pods.gpus:
        return task
    task.set_accelerator_type(pods.accelerator).set_accelerator_limit(pods.gpus)
    for key, value in pods.node_selector():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for toleration in pods.tolerations():
        kubernetes.add_toleration(task, **toleration)
    return task


def step(task: Any, name: str, cache: bool = False) -> Any:
    """Every pod of the pipeline: its display name, whether KFP may cache it, and no Istio sidecar (the label)."""
    kubernetes.add_pod_label(task, *NO_SIDECAR)
    return task.set_display_name(name).set_caching_options(cache)


def with_namespace(task: Any) -> Any:
    """The pod's namespace as POD_NAMESPACE (downward API): the Services are created and deleted there."""
    return kubernetes.use_field_path_as_env(task, env_name="POD_NAMESPACE", field_path="metadata.namespace")


def training_pod(task: Any, pods: PodSettings) -> Any:
    """A training task's pod: its name and namespace (downward API), label, resources, retry, timeout and GPUs."""
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
    return with_accelerators(task, pods)
