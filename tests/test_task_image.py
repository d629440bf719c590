"""A TFJob replica's image that is not this project's: `pip install "kfp-tf-multiworker[task]"` into a TensorFlow
image (pipelines/tfjob_example/Dockerfile). What the `task` extra must hold, that Dockerfile, and the e2e harness
that gives a task its `secretAsEnv` as a cluster would (`make e2e` runs both in containers).
"""

import base64
import configparser
import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import trainer
from tests.support.paths import ROOT

# What a task's container imports before and while it runs the user's command: KFP's executor, the component, the
# command step, and the Kubernetes mode's discovery, claims and status.
TASK_MODULES = [
    "kfp.dsl.executor_main",
    "components.run_command",
    "trainer.command.run",
    "trainer.cluster.discovery",
    "trainer.k8s.checkpoints",
    "trainer.cluster.configmap_status",
]


def _extras():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = {
        "install_requires": cfg["options"]["install_requires"],
        **{name: value for name, value in cfg["options.extras_require"].items()},
    }
    return {name: [Requirement(r) for r in value.split("\n") if r.strip()] for name, value in lines.items()}


def _name(text):
    return re.sub(r"[-_.]+", "-", text).lower()


def _closure(requirements):
    """The distributions `requirements` install, with their dependencies (as installed here), by normalised name."""
    found, todo = set(), [r for r in requirements]
    while todo:
        requirement = todo.pop()
        name = _name(requirement.name)
        if name in found or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        found.add(name)
        try:
            todo.extend(Requirement(r) for r in importlib.metadata.requires(requirement.name) or [])
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def test_the_task_extra_pins_what_the_pipeline_extra_pins():
    extras = _extras()
    task = {_name(r.name): str(r.specifier) for r in extras["task"]}
    pipeline = {_name(r.name): str(r.specifier) for r in extras["pipeline"]}
    assert {"kfp", "kubernetes"} <= set(task)
    assert all(spec.startswith("==") for spec in task.values()), "exact pins"
    assert {name: pipeline.get(name) for name in task} == task


def _owner(module):
    """The installed distribution that holds `module`'s file (normalised name)."""
    if module.split(".")[0] in ("trainer", "components", "pipelines"):
        return "kfp-tf-multiworker"
    path = Path(importlib.import_module(module).__file__).resolve()
    for name in importlib.metadata.packages_distributions().get(module.split(".")[0], []):
        distribution = importlib.metadata.distribution(name)
        if any(Path(distribution.locate_file(f)).resolve() == path for f in distribution.files or []):
            return _name(name)
    return None


def test_what_a_task_imports_is_installed_by_the_package_and_its_task_extra():
    """KFP's executor and the Kubernetes client, which a task's container imports, come with `pip install ...[task]`
    and not without the extra."""
    owners = {module: _owner(module) for module in [*TASK_MODULES, "kubernetes.client", "yaml"]}
    extras = _extras()
    with_task, without = _closure(extras["install_requires"] + extras["task"]), _closure(extras["install_requires"])
    third_party = {m: o for m, o in owners.items() if o != "kfp-tf-multiworker"}
    assert set(third_party.values()) == {"kfp", "kubernetes", "pyyaml"}, owners
    assert set(third_party.values()) <= with_task
    assert {"kfp", "kubernetes"}.isdisjoint(without), "the extra is needed"


DOCKERFILE = (ROOT / "pipelines" / "tfjob_example" / "Dockerfile").read_text()


def _instructions(text):
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_example_image_is_a_plain_tensorflow_image_plus_the_package_with_its_task_extra():
    instructions = _instructions(DOCKERFILE)
    tensorflow = next(r for r in _extras()["install_requires"] if r.name == "tensorflow")
    assert instructions[:2] == [f"ARG BASE=tensorflow/tensorflow:{str(tensorflow.specifier)[2:]}", "FROM ${BASE}"]
    wheel = f"kfp_tf_multiworker-{trainer.__version__}-py3-none-any.whl"
    assert f"COPY {wheel} /tmp/" in instructions
    (install,) = [i for i in instructions if "pip install" in i]
    assert f'pip install --no-cache-dir "/tmp/{wheel}[task]"' in install
    assert sorted(re.findall(r"--mount=(\S+)", install)) == [
        "type=secret,id=cacert,target=/etc/ssl/certs/build-ca.crt",
        "type=secret,id=pipconf,target=/etc/pip.conf",
    ]
    assert instructions[-1] == "COPY train.py /app/train.py"
    stand_in = _instructions((ROOT / ".ci" / "containers" / "tensorflow" / "Dockerfile").read_text())
    pin = f"tensorflow{tensorflow.specifier}"
    assert re.sub(r"^RUN\s+(--\S+\s+)*", "", stand_in[-1]) == f"pip install --no-cache-dir {pin}"


@pytest.fixture
def stand_in(tmp_path):
    from tests.standins.cluster import StandInCluster

    with StandInCluster.start(tmp_path, "127.0.0.1", namespace="team", dns_port=0) as cluster:
        yield cluster


def _secret_job(optional_extra=""):
    from trainer.command.tfjob_spec import read_manifest

    manifest = yaml.safe_load(
        """
kind: TFJob
apiVersion: kubeflow.org/v1
metadata: {name: secret}
spec:
  tfReplicaSpecs:
    Worker:
      replicas: 1
      template:
        spec:
          containers:
            - name: tensorflow
              image: example/user:1
              command: [python, /app/train.py]
              env:
                - {name: PLAIN, value: "1"}
                - name: API_TOKEN
                  valueFrom: {secretKeyRef: {name: api, key: token}}
"""
    )
    from pipelines.jobs import tfjob_pipeline

    return tfjob_pipeline(read_manifest(manifest), "example/ours:1")


def _env(pipeline, label):
    container = pipeline.pipeline_spec.deployment_spec["executors"][label]["container"]
    return {e["name"]: e["value"] for e in container["env"]} if "env" in container else {}


def test_the_harness_gives_only_the_replicas_task_its_secret_read_over_https(stand_in):
    from tests import e2e_cluster

    stand_in.api.add(
        "secrets", "team", {"metadata": {"name": "api"}, "data": {"token": base64.b64encode(b"s3").decode()}}
    )
    pipeline = _secret_job()
    assert e2e_cluster.apply_secrets_as_env(pipeline, stand_in, "team") == {"exec-run-command": ["API_TOKEN"]}
    assert _env(pipeline, "exec-run-command") == {"API_TOKEN": "s3"}
    assert _env(pipeline, "exec-create-job-cluster") == {}
    assert [(c.verb, c.resource, c.name) for c in stand_in.api.calls] == [("get", "secrets", "api")]


def test_the_harness_refuses_a_missing_secret_as_a_pod_would_not_start(stand_in):
    from tests import e2e_cluster

    with pytest.raises(LookupError, match=r"exec-run-command: Secret team/api: 404"):
        e2e_cluster.apply_secrets_as_env(_secret_job(), stand_in, "team")
    stand_in.api.add("secrets", "team", {"metadata": {"name": "api"}, "data": {"other": "eA=="}})
    with pytest.raises(LookupError, match=r"has no key 'token'"):
        e2e_cluster.apply_secrets_as_env(_secret_job(), stand_in, "team")
