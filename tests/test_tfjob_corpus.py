"""TFJob manifests shaped as teams wrote them (tests/tfjob_corpus, from the survey in docs/migrate-from-tfjob.md).

Each file says on its first line what must happen to it: `# expect: compiled`, or `# expect: refused FIELD ...`
naming every field the refusal line must name. Every key of every manifest is accounted for: carried into the
compiled YAML (found there, in the sections of its own replica's task), warned about, or refused. A refused manifest
is walked too, with its refused fields taken out: the rest must compile and be accounted for the same way. Every
hand-off of each compiled pipeline arrives as the type its component declares (as KFP's driver checks it).
"""

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from trainer.command.tfjob_spec import REPLICA_TYPES, read_manifest
from trainer.core import quantity
from trainer.core.errors import UsageError

CORPUS = sorted((ROOT / "tests" / "tfjob_corpus").glob("*.yaml"))
IMAGE = "registry.example.com/team/kfp-tf-multiworker:0.1.0"
# Keys that select or link rather than carry a value: the main container's name, a volume's name that links a mount
# to its volume, the TF port's name, the manifest's own type.
STRUCTURAL = (
    re.compile(r"^(apiVersion|kind)$"),
    re.compile(r"\.containers\[0\]\.name$"),
    re.compile(r"\.volumes\[\d+\]\.name$"),
    re.compile(r"\.volumeMounts\[\d+\]\.name$"),
    re.compile(r"\.ports\[\d+\]\.name$"),
)


def _expectation(path: Path) -> tuple[str, list[str]]:
    first = path.read_text().splitlines()[0]
    match = re.match(r"^# expect: (compiled|refused)(.*)$", first)
    assert match, f"{path.name}: the first line must say what is expected"
    return match.group(1), match.group(2).split()


def _leaves(node, path=""):
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _leaves(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list) and node:
        for i, value in enumerate(node):
            yield from _leaves(value, f"{path}[{i}]")
    else:
        yield path, node


def _field(line: str) -> str:
    return re.split(r" \(|: ", line, maxsplit=1)[0]


def _canonical(path: str) -> str:
    """Replica keys as the reader names them (it reads them case-insensitively)."""
    match = re.match(r"^spec\.tfReplicaSpecs\.([^.]+)(.*)$", path)
    if not match:
        return path
    kind = next((k for k in (*REPLICA_TYPES, "Master") if k.lower() == match.group(1).lower()), match.group(1))
    return f"spec.tfReplicaSpecs.{kind}{match.group(2)}"


def _within(path: str, fields: list[str]) -> bool:
    return any(path == f or path.startswith(f + ".") or path.startswith(f + "[") for f in fields)


def _parent(manifest: dict, field: str):
    """The node holding the field `field` (a reader's dotted path with [i] indices) of `manifest`, and its key."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", field.replace("rdma/hca", "rdma~hca"))
    node = manifest
    keys = [int(p[1:-1]) if p.startswith("[") else p.replace("rdma~hca", "rdma/hca") for p in parts]
    for key in keys[:-1]:
        if isinstance(node, dict) and key not in node:
            key = next(k for k in node if str(k).lower() == str(key).lower())
        node = node[key]
    return node, keys[-1]


def _remove(manifest: dict, field: str) -> None:
    node, last = _parent(manifest, field)
    if isinstance(node, list):
        node[last] = None
        node[:] = [n for n in node if n is not None]
    else:
        del node[last]


def _set(manifest: dict, field: str, value) -> None:
    node, last = _parent(manifest, field)
    node[last] = value


def _compile(manifest: dict, tmp_path: Path) -> tuple[object, dict, dict]:
    from kfp import compiler

    from pipelines.factories import DEFAULT_PODS
    from pipelines.jobs import replica_pods, tfjob_pipeline

    job = read_manifest(manifest)
    for replica in job.replicas:
        replica_pods(replica, DEFAULT_PODS, job.deadline)
    out = tmp_path / "job.yaml"
    compiler.Compiler().compile(tfjob_pipeline(job, IMAGE), str(out))
    spec, platform = yaml.safe_load_all(out.read_text())
    return job, spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def _sections(spec: dict, executors: dict) -> dict[str, dict]:
    """Per task type, what its task carries: its inputs, its container and its pod's platform settings."""
    common = {
        "root": spec["root"]["inputDefinitions"]["parameters"],
        "name": spec["pipelineInfo"]["name"],
        "cluster": {
            name: value["runtimeValue"]["constant"]
            for name, value in spec["root"]["dag"]["tasks"]["create-job-cluster"]["inputs"]["parameters"].items()
            if "runtimeValue" in value
        },
    }
    found = {}
    for component in [spec["root"], *spec["components"].values()]:
        for task in component.get("dag", {}).get("tasks", {}).values():
            parameters = task.get("inputs", {}).get("parameters", {})
            task_type = parameters.get("task_type", {}).get("runtimeValue", {}).get("constant")
            if not task_type:
                continue
            executor = spec["components"][task["componentRef"]["name"]]["executorLabel"]
            found[task_type] = {
                "inputs": parameters,
                "container": spec["deploymentSpec"]["executors"][executor]["container"],
                "pod": executors[executor],
                **common,
            }
    return found


def _carried(path: str, value, sections: dict) -> bool:
    if any(p.search(path) for p in STRUCTURAL):
        return True
    if value in ({}, [], False, None):
        return True
    if path == "metadata.name":
        return next(iter(sections.values()))["name"] == f"tfjob-{value}"
    if path == "spec.successPolicy":
        return all(s["inputs"]["success_policy"]["runtimeValue"]["constant"] == value for s in sections.values())
    match = re.match(r"^spec\.tfReplicaSpecs\.([^.]+)\.(.*)$", _canonical(path))
    assert match, path
    section = sections[REPLICA_TYPES[match.group(1)]]
    rest = match.group(2)
    if rest == "replicas":
        cluster = section["cluster"]
        tasks = {"chief": int(cluster["chief"]), "evaluator": int(cluster["evaluator"])}
        tasks.update(ps=cluster["num_ps"], worker=cluster["num_workers"])
        return tasks[REPLICA_TYPES[match.group(1)]] == value
    resource = re.search(r"resources\.(requests|limits)\.(cpu|memory)$", rest)
    if resource:
        kind, name = resource.groups()
        key = f"resource{name.capitalize() if name == 'memory' else 'Cpu'}{kind[:-1].capitalize()}"
        compiled = section["container"].get("resources", {}).get(key)
        return compiled is not None and quantity.parse(compiled, key) == quantity.parse(value, path)
    if re.search(r"resources\.(requests|limits)\.(nvidia|amd)\.com/gpu$", rest):
        accelerator = section["container"]["resources"]["accelerator"]
        return accelerator["resourceType"] == rest.rsplit(".", 1)[-1] and int(accelerator["resourceCount"]) == value
    text = json.dumps(section)
    if isinstance(value, str):
        return json.dumps(value)[1:-1] in text
    return re.search(rf"(?<![\d.]){json.dumps(value)}(?:\.0)?(?![\d])", text) is not None


def _account(manifest: dict, tmp_path: Path, refused: list[str]) -> None:
    from tests.support.pipelines import type_flow

    job, spec, executors = _compile(manifest, tmp_path)
    assert [f for f in type_flow(spec) if f[3] != f[4]] == [], "a hand-off arrives as another type than declared"
    warned = [_canonical(_field(line)) for line in job.warnings]
    sections = _sections(spec, executors)
    silent = [
        path
        for path, value in _leaves(manifest)
        if not _within(_canonical(path), warned + refused) and not _carried(path, value, sections)
    ]
    assert silent == [], "neither carried, warned nor refused"


def test_the_corpus_has_the_shapes_teams_write():
    assert len(CORPUS) >= 15
    text = "\n".join(p.read_text() for p in CORPUS)
    for shape in (
        "nodeSelector",
        "tolerations",
        "nodeAffinity",
        "secretKeyRef",
        "configMapKeyRef",
        "secretName",
        "configMap:",
        "emptyDir",
        "imagePullSecrets",
        "PS:",
        "Evaluator:",
        "1.5Gi",
        "activeDeadlineSeconds",
        "annotations",
        "nvidia.com/gpu",
    ):
        assert shape in text, shape
    assert {_expectation(p)[0] for p in CORPUS} == {"compiled", "refused"}


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_key_of_a_teams_manifest_is_carried_warned_or_refused(path, tmp_path):
    outcome, fields = _expectation(path)
    manifest = yaml.safe_load(path.read_text())
    if outcome == "refused":
        with pytest.raises(UsageError) as refusal:
            read_manifest(copy.deepcopy(manifest))
        message = str(refusal.value)
        assert "\n" not in message
        assert message.count(": ") >= len(fields)
        for field in fields:
            assert any(f"{field}{after}" in message for after in (": ", " (", " '")), field
        for field in sorted(fields, key=lambda f: -len(f)):
            if field.endswith(".command"):
                _set(manifest, field, ["python", "train.py"])
            elif field != "spec.tfReplicaSpecs":
                _remove(manifest, field)
        if fields == ["spec.tfReplicaSpecs"]:
            manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] = 2
    _account(manifest, tmp_path, fields if outcome == "refused" else [])


def _nodes(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _nodes(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _nodes(value, (*path, i))


def test_any_value_of_the_wrong_type_anywhere_is_one_refusal_never_a_traceback():
    """Every node of every corpus manifest replaced in turn by values of other types: a refusal or a job."""
    wrong = (None, 0, -1, 1.5, True, "x", [], {}, [1], {"a": 1}, [None])
    tried = 0
    for path in CORPUS:
        manifest = yaml.safe_load(path.read_text())
        for at in [p for p in _nodes(manifest) if p]:
            for value in wrong:
                changed = copy.deepcopy(manifest)
                node = changed
                for key in at[:-1]:
                    node = node[key]
                node[at[-1]] = copy.deepcopy(value)
                try:
                    read_manifest(changed)
                except UsageError as err:
                    assert "\n" not in str(err)
                tried += 1
    assert tried > 5000
