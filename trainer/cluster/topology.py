"""TF_CONFIG as a pure function of the cluster, the task type and the task index.

No TensorFlow import at module level: the pipeline's cluster step and the local launcher use this without paying
for it; only `cluster_resolver` imports TensorFlow, for the runners.
The chief rule is TensorFlow's: the `chief` task if the cluster has one, else worker 0.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from trainer.core.errors import UsageError
from trainer.core.tasks import TaskId

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)


def split_address(address: str) -> tuple[str, int]:
    """Splits `host:port` (or `[v6]:port`) after checking both parts.

    Raises:
        UsageError: naming the address when the host or the port is not valid.
    """
    if not isinstance(address, str) or ":" not in address:
        raise UsageError(f"address {address!r} is not of the form host:port")
    host, _, port_text = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise UsageError(f"address {address!r} has an invalid IPv6 host {host!r}") from None
    elif ":" in host:
        raise UsageError(f"address {address!r}: an IPv6 host goes in brackets, as in [::1]:2222")
    elif not _HOSTNAME.match(host):
        raise UsageError(f"address {address!r} has an invalid host {host!r} (a DNS name or an IP address)")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(f"address {address!r} has port {port_text!r}; allowed: an integer from 1 to 65535")
    return host, int(port_text)


def connect_host(host: str) -> str:
    """The host of `split_address` as sockets take it: an IPv6 literal without its brackets (`[::1]` -> `::1`)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def next_port(address: str) -> str:
    """The same host with the next port: a task's supervisor's control address beside its TF address."""
    host, port = split_address(address)
    return f"{host}:{port + 1}"


def make_cluster(workers: Sequence[str], chief: str | None = None, ps: Sequence[str] = ()) -> dict[str, list[str]]:
    """Builds a cluster spec from worker addresses and optional chief and parameter-server addresses."""
    cluster: dict[str, list[str]] = {}
    if chief is not None:
        cluster["chief"] = [chief]
    cluster["worker"] = list(workers)
    if ps:
        cluster["ps"] = list(ps)
    return validate_cluster(cluster)


def has_chief(num_ps: int, chief: bool) -> bool:
    """Whether a cluster has a chief task: when asked for, and always beside parameter servers."""
    return bool(chief or num_ps)


def task_count(num_workers: int, num_ps: int = 0, chief: bool = False, evaluator: bool = False) -> int:
    """How many tasks (and so addresses) `assign_addresses` places: workers, ps, the chief and the evaluator."""
    return num_workers + num_ps + has_chief(num_ps, chief) + bool(evaluator)


def assign_addresses(
    addresses: Sequence[str], num_workers: int, num_ps: int = 0, chief: bool = False, evaluator: bool = False
) -> dict[str, list[str]]:
    """A cluster spec from addresses listed in `task_order`.

    The chief first (with ps, or when asked), then the workers, then the ps, then the evaluator; without ps and chief
    all are workers. A chief alone has no `worker` job.
    """
    cluster: dict[str, list[str]] = {}
    first = int(has_chief(num_ps, chief))
    if first:
        cluster["chief"] = list(addresses[:1])
    if num_workers or not first:
        cluster["worker"] = list(addresses[first : first + num_workers])
    if num_ps:
        cluster["ps"] = list(addresses[first + num_workers : first + num_workers + num_ps])
    if evaluator:
        cluster["evaluator"] = list(addresses[first + num_workers + num_ps :][:1])
    return cluster


class Task(NamedTuple):
    """One task of a cluster: its job, its index in the job, its address; `name` as logs say it (`worker 1`)."""

    job: str
    index: int
    address: str

    @property
    def name(self) -> str:
        """The task as log lines and errors name it."""
        return TaskId(self.job, self.index).name


def tasks(cluster: Mapping[str, Sequence[str]]) -> list[Task]:
    """Every task of a cluster in chief, worker, ps, evaluator order.

    The order `assign_addresses` reads addresses in, the order of a run's Services, and the order local processes
    start in.
    """
    return [Task(job, i, address) for job in TASK_TYPES for i, address in enumerate(cluster.get(job, []))]


def task_order(cluster: Mapping[str, Sequence[str]]) -> list[str]:
    """Every address in `tasks` order."""
    return [task.address for task in tasks(cluster)]


def peers(tf_config: Mapping[str, Any]) -> list[Task]:
    """Every task but this one, in `tasks` order."""
    own = own_address(tf_config)
    return [task for task in tasks(tf_config["cluster"]) if task.address != own]


def validate_cluster(cluster: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Checks a cluster spec and returns it as plain lists.

    Raises:
        UsageError: on an unknown job name, an empty cluster, a bad or duplicated address, or more than one chief.
    """
    if not isinstance(cluster, Mapping):
        raise UsageError(f"cluster {cluster!r} must be a mapping of job name to addresses")
    checked: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    for job, addresses in cluster.items():
        if job not in TASK_TYPES:
            raise UsageError(f"cluster job {job!r} is unknown; allowed: {', '.join(TASK_TYPES)}")
        if isinstance(addresses, str) or not isinstance(addresses, Sequence):
            raise UsageError(f"cluster job {job!r} must list addresses, got {addresses!r}")
        for address in addresses:
            split_address(address)
            if address in seen:
                raise UsageError(
                    f"address {address!r} appears twice (in {seen[address]!r} and {job!r}); each task needs its own"
                )
            seen[address] = job
        checked[job] = list(addresses)
    if not seen:
        raise UsageError("cluster has no addresses; give at least one worker address")
    if len(checked.get("chief", [])) > 1:
        raise UsageError(f"cluster has {len(checked['chief'])} chief addresses {checked['chief']}; allowed: at most 1")
    return checked


def build_tf_config(
    cluster: Mapping[str, Sequence[str]] | Sequence[str],
    task_type: str,
    task_index: int,
    environment: str | None = None,
) -> dict[str, Any]:
    """Returns the TF_CONFIG dict for one task, the cluster checked (`validate_cluster`).

    Args:
        cluster: a cluster spec (`{"worker": [...], "chief": [...], "ps": [...]}`) or a plain list of worker addresses.
        task_type: this task's job name, one of `chief`, `worker`, `ps`, `evaluator`.
        task_index: this task's position within its job.
        environment: TF_CONFIG's `environment` key (`cloud`, as TFJob's operator sets it); None: no such key.

    Raises:
        UsageError: naming the bad value (empty cluster, duplicate address, unknown task type, index out of range...).
    """
    if isinstance(cluster, str):
        raise UsageError(f"cluster {cluster!r} must be a list of addresses or a mapping, not a string")
    spec = validate_cluster(cluster if isinstance(cluster, Mapping) else {"worker": list(cluster)})
    if task_type not in spec:
        raise UsageError(f"task type {task_type!r} is not in the cluster; allowed: {', '.join(spec)}")
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise UsageError(f"task index {task_index!r} must be an integer")
    size = len(spec[task_type])
    if not 0 <= task_index < size:
        raise UsageError(f"task index {task_index} is out of range for {task_type!r}; allowed: 0 to {size - 1}")
    built: dict[str, Any] = {"cluster": spec, "task": {"type": task_type, "index": task_index}}
    if environment is not None:
        built["environment"] = environment
    return built


def parse_tf_config(text: str) -> dict[str, Any]:
    """Parses and checks a TF_CONFIG JSON string (as found in the environment)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"TF_CONFIG is not valid JSON ({err.msg} at position {err.pos}): {text[:80]!r}") from None
    if not isinstance(raw, dict) or "cluster" not in raw or "task" not in raw:
        raise UsageError(f"TF_CONFIG needs 'cluster' and 'task' keys, got {text[:80]!r}")
    task = raw["task"]
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise UsageError(f"TF_CONFIG task {task!r} needs 'type' and 'index'")
    return build_tf_config(raw["cluster"], task["type"], task["index"])


def chief_address(tf_config: Mapping[str, Any]) -> str:
    """The address of the chief: the `chief` task if any, else worker 0."""
    cluster = tf_config["cluster"]
    return cluster["chief"][0] if cluster.get("chief") else cluster["worker"][0]


def is_chief(tf_config: Mapping[str, Any] | None) -> bool:
    """Whether this task is the chief; a task with no TF_CONFIG (a single process) is."""
    if not tf_config:
        return True
    task = tf_config["task"]
    own = tf_config["cluster"][task["type"]][task["index"]]
    return own == chief_address(tf_config)


def own_address(tf_config: Mapping[str, Any]) -> str:
    """This task's own address in its TF_CONFIG."""
    task = tf_config["task"]
    return tf_config["cluster"][task["type"]][task["index"]]


def num_workers(tf_config: Mapping[str, Any] | None) -> int:
    """Number of tasks that train under MultiWorkerMirroredStrategy (chief + workers)."""
    if not tf_config:
        return 1
    cluster = tf_config["cluster"]
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def worker_rank(tf_config: Mapping[str, Any] | None) -> int:
    """This task's position among the training tasks (chief first, then workers): its share of the data."""
    if not tf_config:
        return 0
    task = tf_config["task"]
    has_chief = bool(tf_config["cluster"].get("chief"))
    if task["type"] == "chief":
        return 0
    return task["index"] + (1 if has_chief else 0)


def cluster_resolver(tf_config: dict[str, Any]) -> Any:
    """A cluster resolver for this task, built from `tf_config` (TensorFlow's own resolver reads the environment)."""
    import tensorflow as tf

    task = tf_config["task"]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(tf_config["cluster"]), task_type=task["type"], task_id=task["index"], rpc_layer="grpc"
    )
