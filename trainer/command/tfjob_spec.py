"""What a `kubeflow.org/v1` TFJob meant, as pure functions.

Its manifest read into a `JobSpec`, its TF_CONFIG, its restart policies and Kubernetes' `$(VAR)` expansion of
commands and arguments. The reference is the training-operator's own code, kubeflow/trainer v1.7.0 to v1.9.2
(unchanged across them where cited):

- TF_CONFIG: `pkg/controller.v1/tensorflow/tensorflow.go` (`genTFConfigJSONStr`, `genClusterSpec`): every replica type
  lower-cased in the cluster (the Evaluator too), this task's type and index, `"environment": "cloud"`
  (`TF_CONFIG_ENVIRONMENT`); none at all when the job has one task in total (`util.go`, `isDistributed`, which counts
  the Evaluator). `trainer.cluster.lifecycle` builds it with the one builder, `build_tf_config`. Only the addresses
  differ: each task is reached through the Service its step creates (docs/migrate-from-tfjob.md).
- Restarts (`RESTART_POLICIES`): `pkg/util/train/train_util.go` `IsRetryableExitCode` (`exitCode >= 128`) for
  `ExitCode`; `OnFailure` and `Always` restart after any failure (`pkg/controller.v1/common/pod.go` hands them to the
  kubelet as the pod's own restartPolicy); `Never` is the default (`tensorflow_defaults.go`), per replica.
- Success: `tfjob_controller.go` `UpdateJobStatus`: the Chief succeeded, else worker 0 succeeded (default policy) or
  every worker succeeded (`AllWorkers`).

Every field of a manifest is carried over, kept with a warning, or refused, one line each.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from trainer.cluster.policy import RestartPolicy
from trainer.config import settings
from trainer.config.contract import MAX_WORKERS
from trainer.core import quantity
from trainer.core.errors import UsageError
from trainer.k8s.objects import TAINT_EFFECTS

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
REPLICA_TYPES = {"Chief": "chief", "PS": "ps", "Worker": "worker", "Evaluator": "evaluator"}
TF_CONFIG_ENVIRONMENT = "cloud"
# TFJob's four restart policies, each as the operator decided it. A user's command cannot say that a lost peer made
# it fail (it exits 1 with TensorFlow's traceback), so an exit a policy does not retry asks the peers first
# (`Decision.ASK_PEERS`): a peer's failure at the same moment makes it a lost peer, 138. `Always` runs as `OnFailure`:
# a task that finished is not started again (the manifest reader warns).
RESTART_POLICIES = {
    "Never": RestartPolicy("Never", blame_peers=True),
    "OnFailure": RestartPolicy("OnFailure", from_code=1, blame_peers=True),
    "ExitCode": RestartPolicy("ExitCode", from_code=128, blame_peers=True),
    "Always": RestartPolicy("Always", from_code=1, blame_peers=True),
}
SUCCESS_POLICIES = ("", "AllWorkers")
ACCELERATORS = ("nvidia.com/gpu", "amd.com/gpu")
DEFAULT_CONTAINER = "tensorflow"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def restart_policy(name: str) -> RestartPolicy:
    """The replica's `restartPolicy` as this project's supervisor runs it (`RESTART_POLICIES`).

    Raises:
        UsageError: `name` is not one of TFJob's four.
    """
    if name not in RESTART_POLICIES:
        raise UsageError(f"restart policy {name!r} is not one of {', '.join(RESTART_POLICIES)}")
    return RESTART_POLICIES[name]


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
    """A PersistentVolumeClaim mounted into every task of the replica at `path`."""

    claim: str
    path: str
    read_only: bool = False
    sub_path: str = ""


@dataclasses.dataclass(frozen=True)
class EnvSource:
    """An environment variable the pod fills.

    `kind` secret or config_map: the key `key` of the object `ref`; `kind` field: the pod's field at path `ref`.
    """

    name: str
    kind: str
    ref: str
    key: str = ""
    optional: bool = False


@dataclasses.dataclass(frozen=True)
class Volume:
    """A volume other than a claim: `kind` secret, config_map (`source` the object), empty_dir or ephemeral."""

    kind: str
    name: str
    path: str
    source: str = ""
    optional: bool = False
    medium: str = ""
    size: str = ""
    access_modes: tuple[str, ...] = ()
    storage_class: str = ""


@dataclasses.dataclass(frozen=True)
class Toleration:
    """One toleration, in kfp-kubernetes' `add_toleration` terms."""

    key: str | None = None
    operator: str | None = None
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None


@dataclasses.dataclass(frozen=True)
class NodeTerm:
    """One node-affinity term: required (no weight; terms are ORed) or preferred (with its weight)."""

    match_expressions: tuple[tuple[tuple[str, Any], ...], ...] = ()
    match_fields: tuple[tuple[tuple[str, Any], ...], ...] = ()
    weight: int | None = None


@dataclasses.dataclass(frozen=True)
class Pod:
    """What a replica's pod asks of Kubernetes beyond its command, each a kfp-kubernetes or KFP task setting."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    node_affinity: tuple[NodeTerm, ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    volumes: tuple[Volume, ...] = ()
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool | None = None
    accelerator: str = ""
    accelerators: int = 0


@dataclasses.dataclass(frozen=True)
class Replica:
    """One replica type of the job: how many tasks, and what each runs.

    `requests` and `limits` are as written (KFP's form of each quantity); a resource the manifest leaves out has none.
    """

    type: str
    count: int
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    env_from: tuple[EnvSource, ...]
    requests: tuple[tuple[str, str], ...]
    limits: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    restart_policy: str
    port: int
    working_dir: str = ""
    pod: Pod = Pod()


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A TFJob as this project runs it; `warnings` name what was kept but behaves differently.

    Attributes:
        success_policy: "" (the Chief succeeded, else worker 0) or "AllWorkers" (every worker, without a Chief).
        deadline: runPolicy.activeDeadlineSeconds (0: none): every task's timeout.
        backoff_limit: runPolicy.backoffLimit (None: not given): each task's restarts in place.
    """

    name: str
    namespace: str
    replicas: tuple[Replica, ...]
    warnings: tuple[str, ...]
    success_policy: str = ""
    deadline: int = 0
    backoff_limit: int | None = None

    def replica(self, task_type: str) -> Replica | None:
        """The replica of this type, if the job has one."""
        return next((r for r in self.replicas if r.type == task_type), None)

    @property
    def parameter_servers(self) -> bool:
        """Whether the job trains with parameter servers: its ps and worker tasks serve until the chief is done."""
        return self.replica("ps") is not None

    def max_restarts(self, default: int) -> int:
        """Restarts in place per task: `backoffLimit` when given, else `default`.

        None at all in a MultiWorkerMirrored job with a `Never` replica: a lost peer breaks every collective, so the
        operator failed such a job at the first failure whatever the other replicas' policies.
        """
        training = [r for r in self.replicas if r.type != "evaluator"]
        if not self.parameter_servers and any(r.restart_policy == "Never" for r in training):
            return 0
        return default if self.backoff_limit is None else self.backoff_limit

    @property
    def tasks(self) -> int:
        """Every task of the job, the evaluator's included."""
        return sum(r.count for r in self.replicas)

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

    def rest(self, field: str, given: dict, carried: set[str], warned: dict[str, str], refused: dict[str, str]) -> None:
        """Warns about or refuses each key of `given` that is not `carried`, one line each."""
        for key in sorted(set(given) - carried):
            if key in _DEFAULTS and given[key] == _DEFAULTS[key] and type(given[key]) is type(_DEFAULTS[key]):
                self.warn(f"{field}.{key}", f"{given[key]!r} is Kubernetes' default; nothing to carry")
            elif key in warned:
                self.warn(f"{field}.{key}", warned[key])
            else:
                self.refuse(f"{field}.{key}", refused.get(key, _NOT_EXPRESSIBLE))

    def mapping(self, field: str, value: Any) -> dict:
        """`value` when it is a mapping (None: empty); anything else is refused and read as empty."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.refuse(field, f"{_shown(value)} is not a mapping")
            return {}
        return value

    def items(self, field: str, value: Any) -> list[tuple[str, dict]]:
        """`(field[i], item)` for a list of mappings (None: none); what is not one is refused, one line each."""
        if value is None:
            return []
        if not isinstance(value, list):
            self.refuse(field, f"{_shown(value)} is not a list")
            return []
        found = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                found.append((f"{field}[{i}]", item))
            else:
                self.refuse(f"{field}[{i}]", f"{_shown(item)} is not a mapping")
        return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_RUN_POLICY_WARNED = {
    "cleanPodPolicy": "every task deletes its own Service when its step ends and KFP keeps or deletes pods by its own "
    "settings (the Workflow's pod GC); not applied",
    "ttlSecondsAfterFinished": "KFP deletes the run's Argo Workflow by its own TTL (an hour after it ends on KFP "
    "2.17); not applied",
    "schedulingPolicy": "no gang scheduling: KFP starts the tasks together and each waits up to startup_timeout for "
    "the others; not applied",
    "suspend": "a pipeline run cannot be created suspended; not applied",
    "managedBy": "not applicable to a pipeline; not applied",
}
_NOT_EXPRESSIBLE = "kfp-kubernetes 2.17 cannot set it on a task"
_POD_REFUSED = {
    "serviceAccountName": "every pod of a KFP run uses the run's service account: give it when you create the run "
    "(kfp Client.create_run_from_pipeline_package(service_account=...)), or use the namespace's default-editor",
    "serviceAccount": "every pod of a KFP run uses the run's service account: give it when you create the run",
    "initContainers": "an init container cannot be added to a KFP task: run its work at the start of the command, or "
    "in a pipeline step before the job",
    "schedulerName": f"{_NOT_EXPRESSIBLE}; KFP's pods use the default scheduler (no gang scheduling)",
    "priorityClassName": f"{_NOT_EXPRESSIBLE}; give the cluster a globalDefault PriorityClass, or queue with Kueue",
    "hostNetwork": f"{_NOT_EXPRESSIBLE}; the tasks reach each other through the Services of the job's cluster step",
    "hostPID": _NOT_EXPRESSIBLE,
    "hostIPC": _NOT_EXPRESSIBLE,
    "dnsPolicy": f"{_NOT_EXPRESSIBLE}; the tasks find each other by Service name with the cluster's DNS",
    "dnsConfig": _NOT_EXPRESSIBLE,
    "hostAliases": f"{_NOT_EXPRESSIBLE}; the tasks find each other by Service name",
    "topologySpreadConstraints": f"{_NOT_EXPRESSIBLE}; spread by node affinity, or per node pool with nodeSelector",
    "runtimeClassName": f"{_NOT_EXPRESSIBLE}; a GPU runtime is usually the node's default (NVIDIA's operator)",
    "nodeName": f"{_NOT_EXPRESSIBLE}; select nodes with nodeSelector (kubernetes.io/hostname) instead",
}
_POD_WARNED = {
    "restartPolicy": "replaced by the replica's restartPolicy, as the operator replaced it (it logged an event)",
    "terminationGracePeriodSeconds": "not applied: KFP's pods keep Kubernetes' default of 30 s, and SIGTERM stops "
    "the command within 2 s (exit 143)",
    "enableServiceLinks": "not applied: Kubernetes' default (true)",
    "automountServiceAccountToken": "not applied: the task's supervisor needs the token for its Service",
}
_POD_CARRIED = {
    "containers",
    "volumes",
    "nodeSelector",
    "tolerations",
    "affinity",
    "imagePullSecrets",
    "securityContext",
}
_CONTAINER_CARRIED = {
    "name",
    "image",
    "command",
    "args",
    "env",
    "resources",
    "ports",
    "volumeMounts",
    "workingDir",
    "imagePullPolicy",
    "securityContext",
}
_CONTAINER_REFUSED = {
    "envFrom": "a whole Secret or ConfigMap as environment cannot be set on a KFP task; name each key in env with "
    "valueFrom.secretKeyRef or valueFrom.configMapKeyRef",
    "lifecycle": _NOT_EXPRESSIBLE,
    "livenessProbe": f"{_NOT_EXPRESSIBLE}; the supervisor's start-up watchdog ends a task whose cluster does not form",
    "readinessProbe": _NOT_EXPRESSIBLE,
    "startupProbe": f"{_NOT_EXPRESSIBLE}; startup_timeout bounds the cluster's start-up",
    "stdin": _NOT_EXPRESSIBLE,
    "tty": _NOT_EXPRESSIBLE,
    "volumeDevices": _NOT_EXPRESSIBLE,
    "resizePolicy": _NOT_EXPRESSIBLE,
}
_CONTAINER_WARNED = {
    "terminationMessagePath": "not applied: the task's error line is in its log",
    "terminationMessagePolicy": "not applied: the task's error line is in its log",
}
# Fields a manifest may spell out at their Kubernetes default: they ask for nothing a KFP task does not already get.
_DEFAULTS = {
    "hostNetwork": False,
    "hostPID": False,
    "hostIPC": False,
    "dnsPolicy": "ClusterFirst",
    "schedulerName": "default-scheduler",
    "shareProcessNamespace": False,
    "tty": False,
    "stdin": False,
    "stdinOnce": False,
}
_SECURITY = {"runAsUser": "run_as_user", "runAsGroup": "run_as_group", "runAsNonRoot": "run_as_non_root"}
_TOLERATION = {
    "key": "key",
    "operator": "operator",
    "value": "value",
    "effect": "effect",
    "tolerationSeconds": "toleration_seconds",
}


def _strings(reader: _Reader, field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        reader.refuse(field, f"{value!r} is not a list of strings")
        return ()
    return tuple(str(v) for v in value)


def _pairs(reader: _Reader, field: str, value: Any) -> tuple[tuple[str, str], ...]:
    kept = []
    for key, item in reader.mapping(field, value).items():
        if isinstance(item, str):
            kept.append((str(key), item))
        else:
            reader.refuse(f"{field}.{key}", f"{_shown(item)} is not a string, as Kubernetes requires; quote it")
    return tuple(kept)


def _env(reader: _Reader, field: str, items: Any) -> tuple[tuple[tuple[str, str], ...], tuple[EnvSource, ...]]:
    plain: list[tuple[str, str]] = []
    sources: list[EnvSource] = []
    for where, item in reader.items(field, items):
        name = item.get("name")
        if not isinstance(name, str) or not name:
            reader.refuse(where, "an environment variable needs a name")
            continue
        if name == "TF_CONFIG":
            reader.refuse(f"{where} (TF_CONFIG)", "TF_CONFIG is generated for every task; remove it")
            continue
        source = item.get("valueFrom")
        if source is None:
            value = item.get("value")
            if isinstance(value, (dict, list)):
                reader.refuse(f"{where}.value ({name})", f"{_shown(value)} is not a string")
            plain.append((name, "" if value is None else str(value)))
            continue
        kind = next(iter(source), None) if isinstance(source, dict) and len(source) == 1 else None
        ref = source.get(kind) if kind else None
        if kind in ("secretKeyRef", "configMapKeyRef") and isinstance(ref, dict) and {"name", "key"} <= set(ref):
            sources.append(
                EnvSource(
                    name,
                    "secret" if kind == "secretKeyRef" else "config_map",
                    str(ref["name"]),
                    str(ref["key"]),
                    bool(ref.get("optional", False)),
                )
            )
        elif kind == "fieldRef" and isinstance(ref, dict) and ref.get("fieldPath"):
            sources.append(EnvSource(name, "field", str(ref["fieldPath"])))
        else:
            reader.refuse(
                f"{where}.valueFrom ({name})",
                f"{sorted(source) if isinstance(source, dict) else source!r} cannot be set on a KFP task; allowed: "
                "value, or valueFrom.secretKeyRef, configMapKeyRef or fieldRef with their name and key (path)",
            )
    return tuple(plain), tuple(sources)


def _resources(reader: _Reader, field: str, resources: Any) -> tuple[tuple, tuple, str, int]:
    """Requests and limits of cpu and memory in KFP's form, and the accelerator's name and count."""
    resources = reader.mapping(field, resources)
    for name in sorted(set(resources) - {"requests", "limits"}):
        reader.refuse(f"{field}.{name}", _NOT_EXPRESSIBLE)
    amounts: dict[str, dict[str, Any]] = {}
    kept: dict[str, list[tuple[str, str]]] = {"requests": [], "limits": []}
    accelerator, count = "", 0
    for kind in ("requests", "limits"):
        values = resources.get(kind) or {}
        if not isinstance(values, dict):
            reader.refuse(f"{field}.{kind}", f"{values!r} is not a mapping of resource names to quantities")
            continue
        for name, value in values.items():
            where = f"{field}.{kind}.{name}"
            try:
                amounts.setdefault(name, {})[kind] = quantity.parse(value, where)
                if name == "cpu":
                    kept[kind].append((name, quantity.cpu(value, where)))
                elif name == "memory":
                    kept[kind].append((name, quantity.memory(value, where)))
            except UsageError as err:
                reader.refusals.append(str(err))
                continue
            if name in ACCELERATORS:
                whole = amounts[name][kind]
                if whole != int(whole) or whole < 1:
                    reader.refuse(where, f"{value!r} is not allowed; allowed: a whole number of GPUs, at least 1")
                elif accelerator not in ("", name):
                    reader.refuse(where, f"a task asks for one kind of accelerator; it also asks for {accelerator}")
                else:
                    accelerator, count = name, max(count, int(whole))
            elif name not in ("cpu", "memory"):
                reader.refuse(
                    where,
                    f"{_NOT_EXPRESSIBLE}; allowed: cpu, memory and one accelerator ({', '.join(ACCELERATORS)})",
                )
    for name, both in amounts.items():
        if "requests" in both and "limits" in both and both["requests"] > both["limits"]:
            reader.refuse(
                f"{field}.requests.{name}",
                f"the request is above the limit ({resources['requests'][name]} > {resources['limits'][name]}); "
                "Kubernetes rejects such a pod; allowed: a request at most the limit",
            )
        elif name in ACCELERATORS and len(both) == 2 and both["requests"] != both["limits"]:
            reader.refuse(f"{field}.limits.{name}", "an accelerator's request and limit must be equal (Kubernetes)")
    return tuple(kept["requests"]), tuple(kept["limits"]), accelerator, count


def _volumes(reader: _Reader, field: str, pod: dict) -> dict[str, tuple[str, dict]]:
    volumes: dict[str, tuple[str, dict]] = {}
    carried = {
        "persistentVolumeClaim": ("claim", {"claimName", "readOnly"}),
        "emptyDir": ("empty_dir", {"medium", "sizeLimit"}),
        "secret": ("secret", {"secretName", "optional"}),
        "configMap": ("config_map", {"name", "optional"}),
        "ephemeral": ("ephemeral", {"volumeClaimTemplate"}),
    }
    for at, volume in reader.items(f"{field}.volumes", pod.get("volumes")):
        name = volume.get("name")
        kinds = sorted(set(volume) - {"name"})
        where = f"{at} ({name})"
        if not isinstance(name, str) or not name:
            reader.refuse(at, "a volume needs a name")
            continue
        if len(kinds) != 1 or kinds[0] not in carried:
            reader.refuse(
                where,
                f"a {', '.join(kinds)} volume cannot be mounted by a KFP task; allowed: persistentVolumeClaim, "
                "emptyDir, secret, configMap, ephemeral"
                + ("; put the files in a claim or the image" if kinds == ["hostPath"] else ""),
            )
            continue
        kind, keys = carried[kinds[0]]
        source = reader.mapping(f"{where}.{kinds[0]}", volume[kinds[0]])
        for key in sorted(set(source) - keys):
            reader.refuse(f"{where}.{kinds[0]}.{key}", f"{_NOT_EXPRESSIBLE}; allowed: {', '.join(sorted(keys))}")
        named = _SOURCE_NAME.get(kind)
        if named and (not isinstance(source.get(named), str) or not source[named]):
            reader.refuse(f"{where}.{kinds[0]}.{named}", "is missing; name the object to mount")
            continue
        medium = source.get("medium", "") if kind == "empty_dir" else ""
        if not isinstance(medium, str) or not (medium in ("", "Memory") or medium.startswith("HugePages")):
            reader.refuse(f"{where}.emptyDir.medium", f"{_shown(medium)}; allowed: empty, Memory, HugePages")
            continue
        volumes[name] = (kind, source)
    return volumes


def _ephemeral(reader: _Reader, where: str, name: str, path: str, source: dict) -> Volume | None:
    claim = f"{where}.ephemeral.volumeClaimTemplate"
    template = reader.mapping(claim, source.get("volumeClaimTemplate"))
    spec = reader.mapping(f"{claim}.spec", template.get("spec"))
    resources = reader.mapping(f"{claim}.spec.resources", spec.get("resources"))
    size = reader.mapping(f"{claim}.spec.resources.requests", resources.get("requests")).get("storage")
    modes = spec.get("accessModes")
    if not size or not isinstance(modes, list) or not modes or not all(isinstance(m, str) for m in modes):
        reader.refuse(where, "an ephemeral volume needs spec.accessModes and spec.resources.requests.storage")
        return None
    try:
        quantity.parse(size, f"{claim}.spec.resources.requests.storage")
    except UsageError as err:
        reader.refusals.append(str(err))
        return None
    for key in sorted(set(spec) - {"accessModes", "resources", "storageClassName"}):
        reader.refuse(f"{where}.ephemeral.volumeClaimTemplate.spec.{key}", _NOT_EXPRESSIBLE)
    if template.get("metadata"):
        reader.warn(f"{where}.ephemeral.volumeClaimTemplate.metadata", "not applied to the claim")
    return Volume(
        "ephemeral",
        name,
        path,
        size=str(size),
        access_modes=tuple(spec["accessModes"]),
        storage_class=str(spec.get("storageClassName") or ""),
    )


def _mounts(reader: _Reader, field: str, pod: dict, container: dict) -> tuple[tuple[Mount, ...], tuple[Volume, ...]]:
    volumes = _volumes(reader, field, pod)
    claims: list[Mount] = []
    others: list[Volume] = []
    # KFP's driver names each of the pod's volumes after its claim, Secret or ConfigMap (an emptyDir or ephemeral
    # volume after its own name), so two mounts of one would give the pod two volumes of one name.
    mounted: dict[str, str] = {}
    for at, mount in reader.items(f"{field}.containers[0].volumeMounts", container.get("volumeMounts")):
        name = mount.get("name")
        where = f"{at} ({name})"
        if not isinstance(name, str) or not isinstance(mount.get("mountPath"), str) or not mount["mountPath"]:
            reader.refuse(at, "a volume mount needs a name and a mountPath")
            continue
        if name not in volumes:
            listed = pod.get("volumes") if isinstance(pod.get("volumes"), list) else []
            refused = any(isinstance(v, dict) and v.get("name") == name for v in listed)
            reader.refuse(where, "mounts a volume that is refused" if refused else "names no volume of the pod")
            continue
        kind, source = volumes[name]
        path = mount.get("mountPath")
        volume_name = source[_SOURCE_NAME[kind]] if kind in _SOURCE_NAME else name
        if volume_name in mounted:
            reader.refuse(
                where,
                f"{volume_name} is mounted twice ({mounted[volume_name]} and {path}): KFP names a pod's volume after "
                "its claim, Secret or ConfigMap, so each can be mounted once per task; mount it once and use paths "
                "under it",
            )
            continue
        mounted[volume_name] = path
        for key in sorted(set(mount) - {"name", "mountPath", "readOnly", "subPath", "mountPropagation"}):
            reader.refuse(f"{where}.{key}", _NOT_EXPRESSIBLE)
        if mount.get("mountPropagation"):
            reader.refuse(f"{where}.mountPropagation", _NOT_EXPRESSIBLE)
        if mount.get("subPath") and kind != "claim":
            reader.refuse(f"{where}.subPath", "kfp-kubernetes 2.17 mounts a sub-path of a persistentVolumeClaim only")
        read_only = bool(mount.get("readOnly"))
        if kind == "claim":
            read_only = read_only or bool(source.get("readOnly"))
            if read_only:
                reader.warn(
                    f"{where}.readOnly",
                    f"the claim {source.get('claimName')} is mounted read-write: kfp-kubernetes 2.17's mount_pvc has "
                    "no read-only option; the command must not write there",
                )
            claims.append(Mount(str(source.get("claimName")), path, read_only, str(mount.get("subPath") or "")))
            continue
        if read_only and kind in ("empty_dir", "ephemeral"):
            reader.warn(f"{where}.readOnly", "mounted read-write (kfp-kubernetes 2.17 has no read-only option)")
        if kind == "secret":
            others.append(Volume("secret", name, path, str(source.get("secretName")), bool(source.get("optional"))))
        elif kind == "config_map":
            others.append(Volume("config_map", name, path, str(source.get("name")), bool(source.get("optional"))))
        elif kind == "empty_dir":
            size = source.get("sizeLimit")
            if size is not None:
                try:
                    quantity.parse(size, f"{where}.emptyDir.sizeLimit")
                except UsageError as err:
                    reader.refusals.append(str(err))
            others.append(Volume("empty_dir", name, path, medium=str(source.get("medium") or ""), size=str(size or "")))
        elif (volume := _ephemeral(reader, where, name, path, source)) is not None:
            others.append(volume)
    return tuple(claims), tuple(others)


def _tolerations(reader: _Reader, field: str, items: Any) -> tuple[Toleration, ...]:
    kept = []
    for where, item in reader.items(field, items):
        unknown = sorted(set(item) - set(_TOLERATION))
        if unknown:
            reader.refuse(where, f"unknown keys {unknown}; allowed: {', '.join(_TOLERATION)}")
            continue
        if any(not isinstance(item.get(k, ""), str) for k in ("key", "operator", "value", "effect")):
            reader.refuse(where, "key, operator, value and effect are strings, as Kubernetes requires; quote them")
            continue
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            reader.refuse(f"{where}.tolerationSeconds", f"{_shown(seconds)}; allowed: a whole number of seconds")
            continue
        effect = item.get("effect", "NoSchedule")
        if item.get("operator", "Equal") not in ("Equal", "Exists") or effect not in TAINT_EFFECTS:
            reader.refuse(where, f"operator: Equal or Exists; effect: {', '.join(TAINT_EFFECTS)}")
            continue
        kept.append(Toleration(**{_TOLERATION[k]: v for k, v in item.items()}))
    return tuple(kept)


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_SOURCE_NAME = {"claim": "claimName", "secret": "secretName", "config_map": "name"}


def _requirements(reader: _Reader, field: str, items: Any) -> tuple[tuple[tuple[str, Any], ...], ...]:
    kept = []
    for where, item in reader.items(field, items):
        values = item.get("values", [])
        strings = isinstance(values, list) and all(isinstance(v, str) for v in values)
        if not isinstance(item.get("key"), str) or item.get("operator") not in _OPERATORS or not strings:
            reader.refuse(where, f"a requirement needs a key, an operator ({', '.join(_OPERATORS)}) and string values")
            continue
        kept.append(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(item.items())))
    return tuple(kept)


def _term(reader: _Reader, field: str, term: Any, weight: int | None = None) -> NodeTerm:
    term = reader.mapping(field, term)
    return NodeTerm(
        _requirements(reader, f"{field}.matchExpressions", term.get("matchExpressions")),
        _requirements(reader, f"{field}.matchFields", term.get("matchFields")),
        weight,
    )


def _affinity(reader: _Reader, field: str, affinity: Any) -> tuple[NodeTerm, ...]:
    if not isinstance(affinity, dict):
        reader.refuse(field, f"{affinity!r} is not a mapping")
        return ()
    for key in sorted(set(affinity) - {"nodeAffinity"}):
        reader.refuse(
            f"{field}.{key}",
            "kfp-kubernetes 2.17 sets node affinity only; keep tasks apart or together with nodeSelector and node "
            "affinity on node labels",
        )
    field = f"{field}.nodeAffinity"
    node = reader.mapping(field, affinity.get("nodeAffinity"))
    terms = []
    required = f"{field}.requiredDuringSchedulingIgnoredDuringExecution"
    selector = reader.mapping(required, node.get("requiredDuringSchedulingIgnoredDuringExecution"))
    for where, term in reader.items(f"{required}.nodeSelectorTerms", selector.get("nodeSelectorTerms")):
        terms.append(_term(reader, where, term))
    preferred = f"{field}.preferredDuringSchedulingIgnoredDuringExecution"
    for where, item in reader.items(preferred, node.get("preferredDuringSchedulingIgnoredDuringExecution")):
        weight = item.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            reader.refuse(f"{where}.weight", f"{_shown(weight)}; allowed: 1 to 100")
            continue
        terms.append(_term(reader, f"{where}.preference", item.get("preference"), weight))
    allowed = {"requiredDuringSchedulingIgnoredDuringExecution", "preferredDuringSchedulingIgnoredDuringExecution"}
    for key in sorted(set(node) - allowed):
        reader.refuse(f"{field}.{key}", "unknown field")
    return tuple(terms)


def _security(reader: _Reader, field: str, context: Any, into: dict[str, Any]) -> None:
    for key, value in reader.mapping(field, context).items():
        if key in _SECURITY:
            wanted = bool if key == "runAsNonRoot" else int
            if not isinstance(value, wanted) or (wanted is int and (isinstance(value, bool) or value < 0)):
                what = "a boolean" if wanted is bool else "a user or group id ≥ 0"
                reader.refuse(f"{field}.{key}", f"{_shown(value)}; allowed: {what}")
                continue
            into[_SECURITY[key]] = value
        else:
            reader.refuse(
                f"{field}.{key}",
                "kfp-kubernetes 2.17 sets runAsUser, runAsGroup and runAsNonRoot only (KFP drops every capability "
                "and forbids privilege escalation)",
            )


def _port(reader: _Reader, field: str, container: dict) -> int:
    port = settings.default("port")
    for where, item in reader.items(field, container.get("ports")):
        if item.get("name") != "tfjob-port":
            reader.warn(
                where, "not applied: a task's Service exposes its TensorFlow port (tfjob-port) and control port"
            )
        elif isinstance(item.get("containerPort"), int) and 0 < item["containerPort"] < 65535:
            port = item["containerPort"]
        else:
            reader.refuse(f"{where}.containerPort", f"{item.get('containerPort')!r}; allowed: 1 to 65534")
    return port


def _replica(reader: _Reader, kind: str, spec: Any) -> Replica | None:
    field = f"spec.tfReplicaSpecs.{kind}"
    if kind not in REPLICA_TYPES:
        why = (
            "rename it Chief (the same role in TensorFlow)"
            if kind == "Master"
            else f"unknown replica type; allowed: {', '.join(REPLICA_TYPES)}"
        )
        reader.refuse(field, why)
        return None
    if not isinstance(spec, dict):
        reader.refuse(field, "is not a mapping")
        return None
    for key in sorted(set(spec) - {"replicas", "restartPolicy", "template"}):
        reader.refuse(f"{field}.{key}", "unknown field")
    count = spec.get("replicas", 1)
    single = kind in ("Chief", "Evaluator")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1 or (single and count != 1):
        reader.refuse(f"{field}.replicas", f"{count!r}; allowed: {'1' if single else 'an integer ≥ 1'}")
        return None
    policy = spec.get("restartPolicy", "Never")
    if not isinstance(policy, str) or policy not in RESTART_POLICIES:
        reader.refuse(f"{field}.restartPolicy", f"{policy!r}; allowed: {', '.join(RESTART_POLICIES)}")
        return None
    if policy == "Always":
        reader.warn(f"{field}.restartPolicy", "Always is run as OnFailure: a task that finished is not started again")
    template = reader.mapping(f"{field}.template", spec.get("template"))
    for key in sorted(set(template) - {"metadata", "spec"}):
        reader.refuse(f"{field}.template.{key}", "unknown field")
    metadata = reader.mapping(f"{field}.template.metadata", template.get("metadata"))
    for key in sorted(set(metadata) - {"labels", "annotations", "name"}):
        reader.refuse(f"{field}.template.metadata.{key}", "a task's pod takes labels and annotations only")
    if metadata.get("name"):
        reader.warn(f"{field}.template.metadata.name", "not applied: KFP names the pods")
    where = f"{field}.template.spec"
    pod = reader.mapping(where, template.get("spec"))
    containers = [c for _, c in reader.items(f"{where}.containers", pod.get("containers"))]
    if not containers:
        reader.refuse(f"{where}.containers", "the pod has no container")
        return None
    main = next((c for c in containers if c.get("name") == DEFAULT_CONTAINER), containers[0])
    for other in containers:
        if other is not main:
            reader.refuse(
                f"{where}.containers ({other.get('name')})",
                "a KFP task runs one container: sidecars cannot be added; run a logging or proxy agent as a "
                "DaemonSet, or inside the command",
            )
    reader.rest(where, pod, _POD_CARRIED, _POD_WARNED, _POD_REFUSED)
    container = f"{where}.containers[0]"
    reader.rest(container, main, _CONTAINER_CARRIED, _CONTAINER_WARNED, _CONTAINER_REFUSED)
    if not isinstance(main.get("image"), str) or not main["image"]:
        reader.refuse(f"{container}.image", "every replica needs an image")
        return None
    command = _strings(reader, f"{container}.command", main.get("command"))
    if not command:
        reader.refuse(
            f"{container}.command",
            "give the command explicitly (the image's entrypoint is replaced by the pipeline's own)",
        )
    pull_policy = main.get("imagePullPolicy") or ""
    if pull_policy not in ("", "Always", "IfNotPresent", "Never"):
        reader.refuse(f"{container}.imagePullPolicy", f"{pull_policy!r}; allowed: Always, IfNotPresent, Never")
    env, env_from = _env(reader, f"{container}.env", main.get("env"))
    requests, limits, accelerator, accelerators = _resources(reader, f"{container}.resources", main.get("resources"))
    if accelerator:
        reader.warn(
            f"{container}.resources ({accelerator}: {accelerators})",
            "the task's accelerator limit and type; the replica's image must hold a GPU build of TensorFlow: this "
            "project's GPU image (make image-gpu) or one FROM tensorflow/tensorflow:2.21.0-gpu with this package "
            "installed (docs/gpus.md)",
        )
    secrets = []
    for at, item in reader.items(f"{where}.imagePullSecrets", pod.get("imagePullSecrets")):
        if isinstance(item.get("name"), str) and item["name"]:
            secrets.append(item["name"])
        else:
            reader.refuse(at, "needs a name")
    security: dict[str, Any] = {}
    _security(reader, f"{where}.securityContext", pod.get("securityContext"), security)
    _security(reader, f"{container}.securityContext", main.get("securityContext"), security)
    mounts, volumes = _mounts(reader, where, pod, main)
    node_selector = _pairs(reader, f"{where}.nodeSelector", pod.get("nodeSelector"))
    return Replica(
        type=REPLICA_TYPES[kind],
        count=count,
        image=main["image"],
        command=command,
        args=_strings(reader, f"{container}.args", main.get("args")),
        env=env,
        env_from=env_from,
        requests=requests,
        limits=limits,
        mounts=mounts,
        restart_policy="OnFailure" if policy == "Always" else policy,
        port=_port(reader, f"{container}.ports", main),
        working_dir=str(main.get("workingDir") or ""),
        pod=Pod(
            node_selector=node_selector,
            tolerations=_tolerations(reader, f"{where}.tolerations", pod.get("tolerations")),
            node_affinity=_affinity(reader, f"{where}.affinity", pod["affinity"]) if "affinity" in pod else (),
            image_pull_secrets=tuple(secrets),
            image_pull_policy=pull_policy,
            labels=_pairs(reader, f"{field}.template.metadata.labels", metadata.get("labels")),
            annotations=_pairs(reader, f"{field}.template.metadata.annotations", metadata.get("annotations")),
            volumes=volumes,
            accelerator=accelerator,
            accelerators=accelerators,
            **security,
        ),
    )


_RUN_POLICY_KEPT = {
    "activeDeadlineSeconds": (
        1,
        "a whole number of seconds ≥ 1",
        "every task's timeout (Kubernetes' activeDeadlineSeconds of its pod): each task, and each pod KFP re-creates, "
        "gets the whole time, where the operator counted it once for the whole job",
    ),
    "backoffLimit": (
        0,
        "a whole number ≥ 0",
        "each task restarts in place at most this many times (the pipeline's max_restarts), where the operator "
        "counted the restarts of all pods together; KFP re-creates a lost pod on top",
    ),
}


def _run_policy(reader: _Reader, policy: dict) -> tuple[int, int | None]:
    """The deadline (0: none) and backoff limit (None: not given) of `runPolicy`; the rest warned about."""
    kept: dict[str, int] = {}
    for key, value in policy.items():
        field = f"spec.runPolicy.{key}"
        if key not in _RUN_POLICY_KEPT:
            reader.warn(f"{field} ({value!r})", _RUN_POLICY_WARNED.get(key, "not applied"))
            continue
        least, allowed, meaning = _RUN_POLICY_KEPT[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            reader.refuse(field, f"{_shown(value)}; allowed: {allowed}")
            continue
        kept[key] = value
        reader.warn(f"{field} ({value})", meaning)
    return kept.get("activeDeadlineSeconds", 0), kept.get("backoffLimit")


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
    for key in sorted(set(manifest) - {"apiVersion", "kind", "metadata", "spec", "status"}):
        reader.refuse(key, "unknown field")
    if manifest.get("status"):
        reader.warn("status", "a running job's status; not applied")
    metadata = reader.mapping("metadata", manifest.get("metadata"))
    for key in ("labels", "annotations"):
        if metadata.get(key):
            reader.warn(
                f"metadata.{key}",
                "the TFJob's own are not applied (a Kueue queue-name label queues nothing here); labels and "
                "annotations for the pods go in each replica's template.metadata",
            )
    for key in sorted(set(metadata) - {"name", "namespace", "labels", "annotations"}):
        reader.warn(f"metadata.{key}", "not applied")
    if metadata.get("namespace"):
        reader.warn(
            f"metadata.namespace ({metadata['namespace']})",
            "the run's tasks run in the namespace the run is created in",
        )
    spec = reader.mapping("spec", manifest.get("spec"))
    success = spec.get("successPolicy", "")
    if success not in SUCCESS_POLICIES:
        reader.refuse("spec.successPolicy", f"{success!r}; allowed: AllWorkers or empty (the default)")
    if "enableDynamicWorker" in spec:
        reader.warn("spec.enableDynamicWorker", "the number of tasks is fixed when the pipeline is compiled")
    legacy = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"}
    for key in sorted(set(spec) & legacy):
        reader.warn(
            f"spec.{key}",
            "not applied: the operator (v1.7 and later) reads it under spec.runPolicy only and ignored it here; move "
            "it there to have it applied",
        )
    for key in sorted(set(spec) - legacy - {"tfReplicaSpecs", "runPolicy", "successPolicy", "enableDynamicWorker"}):
        reader.refuse(f"spec.{key}", "unknown field")
    deadline, backoff = _run_policy(reader, reader.mapping("spec.runPolicy", spec.get("runPolicy")))
    replicas = []
    for kind, rspec in reader.mapping("spec.tfReplicaSpecs", spec.get("tfReplicaSpecs")).items():
        # The operator reads replica types case-insensitively (setTypeNameToCamelCase): `Ps` and `worker` are PS and
        # Worker.
        canonical = next((k for k in (*REPLICA_TYPES, "Master") if k.lower() == str(kind).lower()), str(kind))
        if (replica := _replica(reader, canonical, rspec)) is not None:
            replicas.append(replica)
    if len({r.type for r in replicas}) < len(replicas):
        reader.refuse("spec.tfReplicaSpecs", "a replica type is given twice (types are read case-insensitively)")
    if not replicas and not reader.refusals:
        reader.refuse("spec.tfReplicaSpecs", "no replicas; give Worker (and optionally Chief, or Chief and PS)")
    kinds = {r.type for r in replicas}
    if "ps" in kinds and not {"chief", "worker"} <= kinds:
        reader.refuse(
            "spec.tfReplicaSpecs.PS",
            "parameter-server training needs a Chief (the coordinator that runs your training loop) and Workers; "
            f"the job has {', '.join(k for k, v in REPLICA_TYPES.items() if v in kinds)}",
        )
    if kinds == {"evaluator"}:
        reader.refuse("spec.tfReplicaSpecs.Evaluator", "an Evaluator evaluates a training job: give Worker or Chief")
    if success and "chief" in kinds:
        reader.warn("spec.successPolicy", "AllWorkers does not apply to a job with a Chief: the Chief decides")
    total = sum(r.count for r in replicas)
    if total > MAX_WORKERS:
        reader.refuse("spec.tfReplicaSpecs", f"{total} tasks in all; allowed: at most {MAX_WORKERS}")
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
        success_policy=success,
        deadline=deadline,
        backoff_limit=backoff,
    )
