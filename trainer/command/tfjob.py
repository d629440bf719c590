"""What a `kubeflow.org/v1` TFJob meant, as pure functions.

Its manifest read into a `JobSpec`, its TF_CONFIG, its restart policies and Kubernetes' `$(VAR)` expansion of
commands and arguments.

The TF_CONFIG is the one the training-operator generated (`pkg/controller.v1/tensorflow/tensorflow.go`): the
cluster keyed by the lower-cased replica type, this task's type and index, and `"environment": "cloud"`. Only the
addresses differ: each task is reached through the Service its step creates (docs/migrate-from-tfjob.md).
Every field of a manifest that this project cannot carry over is refused, or kept with a warning, one line each.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from trainer.core.errors import RETRYABLE_EXIT_CODES, UsageError

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
REPLICA_TYPES = {"Chief": "chief", "PS": "ps", "Worker": "worker"}
RESTART_POLICIES = ("Never", "OnFailure", "ExitCode", "Always")
# The training-operator's ExitCode policy: these are permanent, every other code of 128 and above is retried.
PERMANENT_EXIT_CODES = frozenset({1, 2, 126, 127, 128, 139})
DEFAULT_CONTAINER = "tensorflow"
DEFAULT_PORT = 2222
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def tf_config(cluster: Mapping[str, Sequence[str]], task_type: str, index: int) -> dict[str, Any]:
    """TF_CONFIG exactly as the training-operator built it for task `task_type` `index` of `cluster`."""
    if task_type not in cluster or not 0 <= index < len(cluster[task_type]):
        raise UsageError(f"task {task_type}:{index} is not in the cluster {dict(cluster)}")
    return {
        "cluster": {job: list(addresses) for job, addresses in cluster.items()},
        "task": {"type": task_type, "index": index},
        "environment": "cloud",
    }


def retryable(policy: str):
    """The exit codes that restart a task under the replica's `restartPolicy`, as the operator decided."""
    if policy == "Never":
        return lambda code: False
    if policy in ("OnFailure", "Always"):
        return lambda code: code != 0
    if policy == "ExitCode":
        return lambda code: code in RETRYABLE_EXIT_CODES or (code >= 128 and code not in PERMANENT_EXIT_CODES)
    raise UsageError(f"restart policy {policy!r} is not one of {', '.join(RESTART_POLICIES)}")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of a command or argument: `$(NAME)` from `env`, `$$` is `$`, anything else is kept."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _VAR.sub(one, text)


@dataclasses.dataclass(frozen=True)
class Mount:
    """A PersistentVolumeClaim mounted into every task at `path`."""

    claim: str
    path: str
    read_only: bool = False


@dataclasses.dataclass(frozen=True)
class SecretEnv:
    """An environment variable from a key of a Secret (`valueFrom.secretKeyRef`)."""

    name: str
    secret: str
    key: str


@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica type of the job: how many tasks, and what each runs."""

    type: str
    count: int
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    secret_env: tuple[SecretEnv, ...]
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    restart_policy: str
    port: int


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A TFJob as this project runs it; `warnings` name what was kept but behaves differently."""

    name: str
    namespace: str
    replicas: tuple[Replica, ...]
    warnings: tuple[str, ...]

    def replica(self, task_type: str) -> Replica | None:
        """The replica of this type, if the job has one."""
        return next((r for r in self.replicas if r.type == task_type), None)

    @property
    def parameter_servers(self) -> bool:
        """Whether the job trains with parameter servers: its ps and worker tasks serve until the chief is done."""
        return self.replica("ps") is not None

    @property
    def port(self) -> int:
        """The TensorFlow port every task listens on."""
        return self.replicas[0].port


class _Reader:
    """Collects the refusals and warnings of one manifest, one line each, naming the field."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.warnings: list[str] = []

    def refuse(self, field: str, why: str) -> None:
        self.refusals.append(f"{field}: {why}")

    def warn(self, field: str, why: str) -> None:
        self.warnings.append(f"{field}: {why}")


_RUN_POLICY = {
    "cleanPodPolicy": "every task deletes its own Service when its step ends and KFP keeps or deletes pods by its own "
    "settings (the Workflow's pod GC); not applied",
    "ttlSecondsAfterFinished": "KFP deletes the run's Argo Workflow by its own TTL (an hour after it ends on KFP "
    "2.17); not applied",
    "activeDeadlineSeconds": "not applied; set a timeout on the run instead",
    "backoffLimit": "restarts are the pipeline's max_restarts per task (in place) and KFP's retry of a lost pod",
    "schedulingPolicy": "no gang scheduling: KFP starts the tasks together and each waits up to startup_timeout for "
    "the others",
    "suspend": "a pipeline run cannot be created suspended",
    "managedBy": "not applicable to a pipeline",
}
_SPEC_FIELDS = {
    "successPolicy": "the run succeeds when every task succeeds (the default policy); AllWorkers and ChiefWorker "
    "differ only when some task fails, which fails the run here",
    "enableDynamicWorker": "the number of tasks is fixed when the pipeline is compiled",
}
_CONTAINER_KEYS = {"name", "image", "command", "args", "env", "resources", "ports", "volumeMounts", "workingDir"}
_IGNORED_CONTAINER = {"imagePullPolicy", "terminationMessagePath", "terminationMessagePolicy"}


def _strings(reader: _Reader, field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        reader.refuse(field, f"{value!r} is not a list of strings")
        return ()
    return tuple(value)


def _env(reader: _Reader, field: str, items: Any) -> tuple[tuple[tuple[str, str], ...], tuple[SecretEnv, ...]]:
    plain: list[tuple[str, str]] = []
    secrets: list[SecretEnv] = []
    for i, item in enumerate(items or []):
        where = f"{field}[{i}]"
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            reader.refuse(where, "an environment variable needs a name")
            continue
        if name == "TF_CONFIG":
            reader.refuse(f"{where} (TF_CONFIG)", "TF_CONFIG is generated for every task; remove it")
            continue
        source = item.get("valueFrom")
        if source is None:
            plain.append((name, str(item.get("value", ""))))
        elif set(source) == {"secretKeyRef"} and {"name", "key"} <= set(source["secretKeyRef"]):
            ref = source["secretKeyRef"]
            secrets.append(SecretEnv(name, ref["name"], ref["key"]))
        else:
            reader.refuse(
                f"{where}.valueFrom ({name})",
                f"{sorted(source)} cannot be carried over; allowed: value, or valueFrom.secretKeyRef",
            )
    return tuple(plain), tuple(secrets)


def _resources(reader: _Reader, field: str, resources: Any) -> tuple[tuple, tuple]:
    out = []
    for kind in ("requests", "limits"):
        values = (resources or {}).get(kind) or {}
        kept = []
        for name, value in values.items():
            if name in ("cpu", "memory"):
                kept.append((name, str(value)))
            else:
                reader.refuse(
                    f"{field}.{kind}.{name}",
                    "only cpu and memory are carried over (accelerators: set them on the "
                    "compiled pipeline's task with kfp-kubernetes)",
                )
        out.append(tuple(kept))
    for name in set(resources or {}) - {"requests", "limits"}:
        reader.refuse(f"{field}.{name}", "not carried over")
    return out[0], out[1]


def _mounts(reader: _Reader, field: str, pod: dict, container: dict) -> tuple[Mount, ...]:
    volumes = {}
    for i, volume in enumerate(pod.get("volumes") or []):
        name = volume.get("name")
        kinds = set(volume) - {"name"}
        if kinds == {"persistentVolumeClaim"}:
            volumes[name] = ("claim", volume["persistentVolumeClaim"])
        elif kinds == {"emptyDir"}:
            volumes[name] = ("empty", None)
        else:
            reader.refuse(
                f"{field}.volumes[{i}] ({name})",
                f"a {', '.join(sorted(kinds))} volume cannot be mapped; allowed: persistentVolumeClaim, emptyDir",
            )
    mounts = []
    for i, mount in enumerate(container.get("volumeMounts") or []):
        where = f"{field}.containers[0].volumeMounts[{i}] ({mount.get('name')})"
        if mount.get("subPath"):
            reader.refuse(where, "subPath is not carried over")
            continue
        kind, source = volumes.get(mount.get("name"), (None, None))
        if kind == "claim":
            read_only = bool(mount.get("readOnly") or source.get("readOnly"))
            mounts.append(Mount(source["claimName"], mount["mountPath"], read_only))
        elif kind == "empty":
            reader.warn(where, f"emptyDir at {mount['mountPath']}: the container's own filesystem is used instead")
        elif mount.get("name") not in volumes:
            reader.refuse(where, "names no volume of the pod")
    return tuple(mounts)


def _port(reader: _Reader, field: str, container: dict) -> int:
    for port in container.get("ports") or []:
        if port.get("name") == "tfjob-port":
            return int(port["containerPort"])
    return DEFAULT_PORT


def _replica(reader: _Reader, kind: str, spec: Any) -> Replica | None:
    field = f"spec.tfReplicaSpecs.{kind}"
    if kind not in REPLICA_TYPES:
        why = {
            "Evaluator": "a side-car evaluator is not supported; evaluate after training in a step of its own",
            "Master": "rename it Chief (the same role in TensorFlow)",
        }.get(kind, f"unknown replica type; allowed: {', '.join(REPLICA_TYPES)}")
        reader.refuse(field, why)
        return None
    if not isinstance(spec, dict):
        reader.refuse(field, "is not a mapping")
        return None
    count = spec.get("replicas", 1)
    if not isinstance(count, int) or count < 1 or (kind == "Chief" and count != 1):
        reader.refuse(f"{field}.replicas", f"{count!r}; allowed: {'1' if kind == 'Chief' else 'an integer ≥ 1'}")
        return None
    policy = spec.get("restartPolicy", "Never")
    if policy not in RESTART_POLICIES:
        reader.refuse(f"{field}.restartPolicy", f"{policy!r}; allowed: {', '.join(RESTART_POLICIES)}")
        return None
    if policy == "Always":
        reader.warn(f"{field}.restartPolicy", "Always is run as OnFailure: a task that finished is not started again")
    pod = (spec.get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or []
    if not containers:
        reader.refuse(f"{field}.template.spec.containers", "the pod has no container")
        return None
    main = next((c for c in containers if c.get("name") == DEFAULT_CONTAINER), containers[0])
    for other in containers:
        if other is not main:
            reader.refuse(
                f"{field}.template.spec.containers ({other.get('name')})", "sidecar containers are not carried over"
            )
    for key in sorted(set(pod) - {"containers", "volumes", "restartPolicy"}):
        reader.refuse(f"{field}.template.spec.{key}", "pod-level settings are not carried over")
    for key in sorted(set(main) - _CONTAINER_KEYS - _IGNORED_CONTAINER):
        reader.refuse(f"{field}.template.spec.containers[0].{key}", "not carried over")
    if main.get("workingDir"):
        reader.refuse(f"{field}.template.spec.containers[0].workingDir", "not carried over; use absolute paths")
    if not isinstance(main.get("image"), str) or not main["image"]:
        reader.refuse(f"{field}.template.spec.containers[0].image", "every replica needs an image")
        return None
    command = _strings(reader, f"{field}.template.spec.containers[0].command", main.get("command"))
    if not command:
        reader.refuse(
            f"{field}.template.spec.containers[0].command",
            "give the command explicitly (the image's entrypoint is replaced by the pipeline's own)",
        )
    env, secret_env = _env(reader, f"{field}.template.spec.containers[0].env", main.get("env"))
    requests, limits = _resources(reader, f"{field}.template.spec.containers[0].resources", main.get("resources"))
    return Replica(
        type=REPLICA_TYPES[kind],
        count=count,
        image=main["image"],
        command=command,
        args=_strings(reader, f"{field}.template.spec.containers[0].args", main.get("args")),
        env=env,
        secret_env=secret_env,
        requests=requests,
        limits=limits,
        mounts=_mounts(reader, f"{field}.template.spec", pod, main),
        restart_policy="OnFailure" if policy == "Always" else policy,
        port=_port(reader, field, main),
    )


def read_manifest(manifest: Any) -> JobSpec:
    """Reads a TFJob manifest (parsed YAML) into a `JobSpec`.

    Raises:
        UsageError: one line per field that cannot be carried over, all of them at once.
    """
    reader = _Reader()
    if not isinstance(manifest, dict):
        raise UsageError(f"the manifest is a {type(manifest).__name__}, not a {KIND} object")
    if manifest.get("apiVersion") != API_VERSION or manifest.get("kind") != KIND:
        raise UsageError(
            f"apiVersion {manifest.get('apiVersion')!r}, kind {manifest.get('kind')!r}; allowed: {API_VERSION} {KIND}"
        )
    metadata = manifest.get("metadata") or {}
    spec = manifest.get("spec") or {}
    for key, why in _SPEC_FIELDS.items():
        if key in spec:
            reader.warn(f"spec.{key}", why)
    for key in sorted(set(spec) - set(_SPEC_FIELDS) - {"tfReplicaSpecs", "runPolicy"}):
        reader.refuse(f"spec.{key}", "unknown field")
    for key, value in (spec.get("runPolicy") or {}).items():
        reader.warn(f"spec.runPolicy.{key} ({value!r})", _RUN_POLICY.get(key, "not applied"))
    replicas = [r for kind, rspec in (spec.get("tfReplicaSpecs") or {}).items() if (r := _replica(reader, kind, rspec))]
    if not replicas and not reader.refusals:
        reader.refuse("spec.tfReplicaSpecs", "no replicas; give Worker (and optionally Chief, or Chief and PS)")
    kinds = {r.type for r in replicas}
    if "ps" in kinds and kinds != {"chief", "ps", "worker"}:
        reader.refuse(
            "spec.tfReplicaSpecs.PS",
            "parameter-server training needs a Chief (the coordinator that runs your training loop) and Workers; "
            f"the job has {', '.join(k for k, v in REPLICA_TYPES.items() if v in kinds)}",
        )
    if replicas and len({r.port for r in replicas}) > 1:
        reader.refuse("spec.tfReplicaSpecs.*.ports (tfjob-port)", "every replica must use the same port")
    if reader.refusals:
        raise UsageError(
            f"{KIND} {metadata.get('name', '?')}: {len(reader.refusals)} field(s) cannot be carried over: "
            + "; ".join(reader.refusals)
        )
    replicas.sort(key=lambda r: list(REPLICA_TYPES.values()).index(r.type))
    return JobSpec(
        name=str(metadata.get("name") or "tfjob"),
        namespace=str(metadata.get("namespace") or ""),
        replicas=tuple(replicas),
        warnings=tuple(reader.warnings),
    )
