"""The whole pipeline as a cluster runs it: every step a container of the real image (kfp.local's DockerRunner), in
Kubernetes mode, against the API stand-in over HTTPS (in-cluster config) and the DNS stand-in, on a Docker network in
198.18.0.0/15. Marked `e2e`: `make e2e` runs it after `make image` (root, or a running Docker Engine).
"""

import dataclasses
import ipaddress
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

import trainer
from pipelines.factories import DEFAULT_PODS, mirrored_pipeline
from tests import e2e_cluster

pytestmark = pytest.mark.e2e
IMAGE = os.environ.get("KFP_TF_IMAGE", f"kfp-tf-multiworker:{trainer.__version__}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import docker

    client = docker.from_env()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the engine has no image {IMAGE}: build it with `make image`")
    network, gateway = e2e_cluster.docker_network(client)
    stand_in = e2e_cluster.start_cluster(tmp_path_factory.mktemp("cluster"), gateway)
    image = e2e_cluster.pod_image(client, IMAGE, stand_in)
    kubelet = e2e_cluster.Kubelet(client, image, stand_in)
    try:
        yield client, network, stand_in, image
    finally:
        kubelet.stop()
        stand_in.stop()
        client.images.remove(image, force=True)
        client.close()


def _run(cluster, root, pods=DEFAULT_PODS, **arguments):
    from kfp import local

    client, network, stand_in, image = cluster
    local.init(runner=e2e_cluster.docker_runner(network, stand_in), pipeline_root=str(root), raise_on_error=False)
    return mirrored_pipeline(image, pods)(cluster_mode="kubernetes", source="sample", num_workers=2, **arguments)


def _no_container_left(client, image, wait=20):
    """Whether every container of `image` is gone (kfp.local starts them with auto-remove, which takes a moment)."""
    deadline = time.monotonic() + wait
    while client.api.containers(all=True, filters={"ancestor": image}):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _lifecycle(calls):
    """Per pod: the order of its Service's create and delete and its own patch."""
    return [
        c for c in calls if (c.verb, c.resource) in {("create", "services"), ("patch", "pods"), ("delete", "services")}
    ]


def test_the_pipeline_trains_in_containers_finding_each_other_by_service_name(cluster, capfd):
    client, network, stand_in, image = cluster
    root = e2e_cluster.pipeline_root()
    stand_in.api.calls.clear()
    started = time.monotonic()
    outputs = _run(cluster, root, epochs=6, min_accuracy=0.95, publish_uri=str(root / "published")).outputs
    seconds = time.monotonic() - started
    logs = capfd.readouterr().out
    assert outputs["accuracy"] >= 0.95, logs[-4000:]

    addresses = re.findall(r"worker 0 joins the cluster \{\"worker\": \[(.*?)\]\}", logs)
    assert addresses, logs[-3000:]
    names = re.findall(r'"(tfw-r[0-9a-f]{10}-\d)\.kubeflow-user-e2e\.svc:2222"', addresses[0])
    assert len(names) == 2, "the TF_CONFIG addresses are the Services' DNS names"
    pods = stand_in.api.items("pods", e2e_cluster.NAMESPACE)
    ips = {p["status"]["podIP"] for p in pods.values()}
    subnet = ipaddress.ip_network(client.networks.get(network).attrs["IPAM"]["Config"][0]["Subnet"])
    assert len(ips) == 2 and all(ipaddress.ip_address(ip) in subnet for ip in ips), "two containers, each its IP"
    assert len(re.findall(r"cluster formed: 2 workers", logs)) == 2, "they trained together over TF gRPC"

    lifecycle = _lifecycle(stand_in.api.calls)
    creates = [i for i, c in enumerate(lifecycle) if c.verb == "create"]
    patches = [i for i, c in enumerate(lifecycle) if c.verb == "patch"]
    deletes = [i for i, c in enumerate(lifecycle) if c.verb == "delete"]
    assert (
        len(creates) == len(patches) == len(deletes) == 2
        and max(creates) < max(patches)
        and max(patches) < min(deletes)
    )
    assert {c.name for c in lifecycle if c.verb == "delete"} == set(names)
    assert stand_in.api.items("services") == {}, "no Service of the run is left"
    assert _no_container_left(client, image), "no container of the run is left"

    model = Path(outputs["model"].path)
    assert (model / "saved_model" / "saved_model.pb").is_file() and Path(outputs["report"].path).is_file()
    latest = json.loads((root / "published" / "latest.json").read_text())
    assert (
        latest["metrics"]["accuracy"] == outputs["accuracy"] and (root / "published" / str(latest["version"])).is_dir()
    )
    with capfd.disabled():
        print(f"\ne2e run: {seconds:.0f}s, accuracy {outputs['accuracy']:.4f}")


class Killer:
    """Kills the container of training worker `index` once its log shows `pattern` (a thread); `at` is when.

    `**which`: how to find the workers' containers (`e2e_cluster.training_containers`).
    """

    def __init__(self, client, image, index, pattern, **which):
        self.at = None
        self._which = which
        self._thread = threading.Thread(target=self._kill, args=(client, image, index, pattern), daemon=True)
        self._thread.start()

    def _kill(self, client, image, index, pattern):
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            workers = e2e_cluster.training_containers(client, image, **self._which)
            if index in workers and re.search(pattern, workers[index].logs().decode(errors="replace")):
                workers[index].kill()
                self.at, self.wall = time.monotonic(), time.time()
                return
            time.sleep(0.5)

    def join(self):
        self._thread.join(timeout=10)


@pytest.mark.parametrize("lost", [1, 0], ids=["worker 1", "the chief"])
def test_a_lost_worker_pod_is_re_created_by_the_retry_and_the_run_finishes(cluster, capfd, lost):
    """Argo re-creates a lost pod (OnError on KFP 2.17, set_retry where honoured); kfp.local's retry does the same."""
    client, network, stand_in, image = cluster
    root = e2e_cluster.pipeline_root()
    killer = Killer(client, image, lost, r"epoch 2: ")
    outputs = _run(cluster, root, epochs=6, max_restarts=2, min_accuracy=0.95, publish_uri=str(root / "published"))
    ended = time.monotonic()
    killer.join()
    logs = capfd.readouterr().out
    assert killer.at is not None, logs[-3000:]
    assert outputs.outputs, "the run finished: " + logs[-4000:]
    accuracy = outputs.outputs["accuracy"]
    assert accuracy >= 0.95, logs[-4000:]
    survivor = 1 - lost
    assert re.search(
        rf"worker {lost}: fetching the checkpoint of epoch 2 from the supervisor at tfw-r[0-9a-f]+-"
        rf"{survivor}\.kubeflow-user-e2e\.svc:2223",
        logs,
    ), "the new pod's disk is empty: it gets a copy"
    resumed = {int(w): int(e) for w, e in re.findall(r"worker (\d): generation \d+ resumes after epoch (\d+)", logs)}
    assert resumed == {0: 2, 1: 2}, logs[-4000:]
    assert "start again at epoch 1" not in logs
    history = json.loads((Path(outputs.outputs["model"].path) / "history.json").read_text())
    assert [e["epoch"] for e in history["epochs"]] == list(range(1, 7))
    assert stand_in.api.items("services") == {}, "the replacement adopted its Service and deleted it at the end"
    with capfd.disabled():
        print(
            f"\ne2e lost {'chief' if lost == 0 else f'worker {lost}'}: kill -> both training again "
            f"{_seconds_after(killer.wall, logs, 'resuming from the checkpoint'):.0f}s, kill -> end of run "
            f"{ended - killer.at:.0f}s, resumed after epoch {resumed[lost]}, accuracy {accuracy:.4f}"
        )


def _seconds_after(wall, logs, text):
    """Seconds from `wall` (time.time()) to the last log line with `text` (its HH:MM:SS stamp, UTC)."""
    import datetime

    day = datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).date()
    stamps = [
        datetime.datetime.combine(day, datetime.time.fromisoformat(t), datetime.timezone.utc).timestamp()
        for t in re.findall(rf"(\d\d:\d\d:\d\d) INFO \S+: {re.escape(text)}", logs)
    ]
    return max(stamps) - wall


def test_a_worker_container_killed_mid_training_fails_the_run_fast_naming_the_lost_peer(cluster, capfd):
    client, network, stand_in, image = cluster
    root = e2e_cluster.pipeline_root()
    stand_in.api.calls.clear()
    killer = Killer(client, image, 1, r"epoch 2: ")
    # One attempt and no restarts: nothing re-creates the lost pod, and the survivor must not wait for it.
    single_attempt = dataclasses.replace(DEFAULT_PODS, retries=0)
    result = _run(cluster, root, single_attempt, epochs=30, max_restarts=0, startup_timeout=120.0)
    ended = time.monotonic()
    killer.join()
    logs = capfd.readouterr().out
    assert killer.at is not None, logs[-3000:]
    assert ended - killer.at < 60, f"the run ended {ended - killer.at:.0f}s after the kill"
    assert result.outputs == {} or not result.outputs, "the run failed"
    assert re.search(
        r"error: lost contact with a peer during training \(worker 1 at tfw-r[0-9a-f]{10}-1\."
        r"kubeflow-user-e2e\.svc:2222 \(",
        logs,
    ), logs[-4000:]
    left = stand_in.api.items("services")
    assert len(left) <= 1, "the surviving worker deleted its own Service"
    owner = [ref["name"] for svc in left.values() for ref in svc["metadata"]["ownerReferences"]]
    assert owner in ([], [e2e_cluster.WORKFLOW]), "what the killed pod left is owned by the run's Workflow"
    from kubernetes import client as k8s_client

    api = k8s_client.CustomObjectsApi(k8s_client.ApiClient(stand_in.files.configuration(stand_in.https.port)))
    api.delete_namespaced_custom_object(
        "argoproj.io", "v1alpha1", e2e_cluster.NAMESPACE, "workflows", e2e_cluster.WORKFLOW
    )
    assert stand_in.api.items("services") == {}, "deleting the run removes the rest"
    assert _no_container_left(client, image), "no container of the run is left"


EXAMPLE_IMAGE = os.environ.get("KFP_TF_EXAMPLE_IMAGE", f"kfp-tf-diagnosis-example:{trainer.__version__}")


def test_the_tabular_example_trains_in_its_own_image_survives_a_lost_pod_and_reaches_its_baseline(cluster, capfd):
    """pipelines/tabular_example's TFJob in the user's image FROM this one, by Service name; worker 1's pod is lost in
    epoch 3: KFP's retry re-creates it, worker 0's command restarts in place with it, and both resume from
    BackupAndRestore's checkpoint in a checkpoint_dir every task shares (under the pipeline root, which every
    container mounts, as a claim would be). The baseline is one process in that image with the same epochs."""
    import docker
    import yaml
    from kfp import local

    from pipelines.jobs import tfjob_pipeline
    from tests.support.tabular import AUC_MARGIN
    from trainer.command.tfjob_spec import read_manifest

    client, network, stand_in, image = cluster
    try:
        client.images.get(EXAMPLE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the engine has no image {EXAMPLE_IMAGE}: `make e2e` builds it")
    epochs = "--epochs=60"  # long enough (seconds) to lose a pod mid-training
    output = client.containers.run(
        EXAMPLE_IMAGE,
        ["python", "/opt/diagnosis/diagnosis.py", "--model_dir", "/tmp/m", "--checkpoint_dir", "/tmp/c", epochs],
        remove=True,
        network_mode="none",
    ).decode()
    baseline = float(re.search(r"replicas 1: test .*auc ([\d.]+)", output).group(1))
    example = e2e_cluster.pod_image(client, EXAMPLE_IMAGE, stand_in)
    try:
        job = read_manifest(
            yaml.safe_load((Path(__file__).parents[1] / "pipelines/tabular_example/tfjob.yaml").read_text())
        )
        replicas = tuple(dataclasses.replace(r, image=example, args=(*r.args, epochs)) for r in job.replicas)
        job = dataclasses.replace(job, replicas=replicas)
        root = e2e_cluster.pipeline_root()
        local.init(runner=e2e_cluster.docker_runner(network, stand_in), pipeline_root=str(root), raise_on_error=False)
        killer = Killer(client, example, 1, r"Epoch 3/60", step="run_command", joined="worker {index} runs ")
        result = tfjob_pipeline(job, image)(
            cluster_mode="kubernetes", checkpoint_dir=str(root / "checkpoints"), publish_uri=str(root / "published")
        )
        ended = time.monotonic()
        killer.join()
        logs = capfd.readouterr().out
        assert killer.at is not None, logs[-3000:]
        assert (root / "published" / "latest.json").is_file(), logs[-4000:]
        assert result.output.path
        configs = [json.loads(c) for c in re.findall(r"worker \d runs .*? with TF_CONFIG (\{.*\})$", logs, re.M)]
        assert len(configs) == 3, "worker 1's pod was re-created and ran its command again: " + logs[-3000:]
        names = configs[0]["cluster"]["worker"]
        assert all(re.fullmatch(r"tfw-r[0-9a-f]{10}-\d\.kubeflow-user-e2e\.svc:2222", n) for n in names), names
        assert sorted(c["task"]["index"] for c in configs) == [0, 1, 1], "TFJob's TF_CONFIG, by Service name"
        assert all(c["environment"] == "cloud" and c["cluster"] == {"worker": names} for c in configs)
        assert re.search(r"worker 0: restart 1 of 2 in place \(exit code 138\)", logs), logs[-4000:]
        rerun = [m.start() for m in re.finditer(r"worker 1 runs ", logs)][1]
        again = [int(e) for e in re.findall(r"Epoch (\d+)/60", logs[rerun:])]
        assert again and min(again) >= 3, "both resumed from the shared checkpoint, not from epoch 1"
        assert len(re.findall(r"replicas 2: test", logs)) == 2, "both ran the module and trained together"
        latest = json.loads((root / "published" / "latest.json").read_text())
        auc = latest["metrics"]["auc"]
        assert auc >= baseline - AUC_MARGIN, (auc, baseline)
        assert stand_in.api.items("services") == {}, "each task deleted its own Service"
    finally:
        client.images.remove(example, force=True)
    with capfd.disabled():
        print(
            f"\ne2e tabular example: worker 1's pod lost, both resumed after epoch {min(again) - 1}, kill -> end "
            f"{ended - killer.at:.0f}s; test AUC {auc:.4f} on 2 workers, {baseline:.4f} in one process (same image)"
        )


def test_the_tabular_example_in_module_mode_trains_in_its_own_image_gated_on_auc(cluster, capfd):
    """pipelines/tabular_example's `datasets` and `model` through our runner, evaluation, gate and publish, in pods
    of the user's image. The example's baseline in containers is the test above's; tests/test_module_mode.py compares
    module mode with the same runner in one process."""
    import docker
    from kfp import local

    from tests.support.tabular import EPOCHS

    client, network, stand_in, image = cluster
    try:
        client.images.get(EXAMPLE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the engine has no image {EXAMPLE_IMAGE}: `make e2e` builds it")
    example = e2e_cluster.pod_image(client, EXAMPLE_IMAGE, stand_in)
    try:
        root = e2e_cluster.pipeline_root()
        local.init(runner=e2e_cluster.docker_runner(network, stand_in), pipeline_root=str(root), raise_on_error=False)
        outputs = mirrored_pipeline(example)(
            cluster_mode="kubernetes",
            num_workers=2,
            epochs=int(EPOCHS),
            source="fn:diagnosis:datasets",
            model_fn="diagnosis:model",
            gate="auc>=0.98",
            publish_uri=str(root / "published"),
        ).outputs
        logs = capfd.readouterr().out
        assert (root / "published" / "latest.json").is_file(), logs[-4000:]
        assert outputs["serving_check"] == "passed", logs[-3000:]
        latest = json.loads((root / "published" / "latest.json").read_text())
        assert latest["lineage"]["model_fn"] == "diagnosis:model"
        auc = latest["metrics"]["auc"]
        assert auc >= 0.98 and latest["metrics"]["passed_gate"] == 1 and latest["metrics"]["gate_threshold"] == 0.98
        assert re.search(r"worker 1 joins the cluster \{\"worker\": \[\"tfw-r[0-9a-f]{10}-0\.kubeflow-user-e2e", logs)
        assert stand_in.api.items("services") == {}, "each task deleted its own Service"
    finally:
        client.images.remove(example, force=True)
    with capfd.disabled():
        print(f"\ne2e module mode, tabular example: test AUC {auc:.4f} on 2 workers (gate auc>=0.98)")


TFJOB_IMAGE = os.environ.get("KFP_TF_TFJOB_IMAGE", f"kfp-tf-tfjob-example:{trainer.__version__}")
# A TFJob whose replica image is pipelines/tfjob_example/Dockerfile: a plain TensorFlow image plus
# `pip install kfp-tf-multiworker[task]` and train.py. Its command records a digest of a Secret's value (never the
# value) and then runs train.py; the data and the checkpoints are in the pipeline root, which every container mounts
# (as a claim would be).
SECRET_TFJOB = """
apiVersion: kubeflow.org/v1
kind: TFJob
metadata:
  name: secret-env
spec:
  tfReplicaSpecs:
    Worker:
      replicas: 1
      restartPolicy: Never
      template:
        spec:
          containers:
            - name: tensorflow
              image: {image}
              command:
                - python
                - -c
                - |
                  import hashlib, os, runpy, sys
                  digest = hashlib.sha256(os.environ["API_TOKEN"].encode()).hexdigest()
                  print(f"API_TOKEN sha256 {{digest}}, DATA_SOURCE {{os.environ['DATA_SOURCE']}}", flush=True)
                  sys.argv[0] = "/app/train.py"
                  runpy.run_path("/app/train.py", run_name="__main__")
              args:
                - --data_dir={data}
                - --saved_model_dir=$(MODEL_DIR)/saved_model
                - --checkpoint_dir=$(CHECKPOINT_DIR)
                - --metrics_file=$(MODEL_DIR)/metrics.json
                - --epochs=1
              env:
                - name: DATA_SOURCE
                  value: mnist-sample
                - name: API_TOKEN
                  valueFrom:
                    secretKeyRef:
                      name: e2e-api
                      key: token
              resources:
                limits:
                  cpu: "1"
                  memory: 2Gi
"""


def test_a_tfjob_runs_in_a_plain_tensorflow_image_with_the_package_installed_and_gets_its_secret_as_env(cluster, capfd):
    """A converted TFJob's task in an image FROM a plain TensorFlow base with `pip install kfp-tf-multiworker[task]`
    (pipelines/tfjob_example/Dockerfile): KFP's executor starts in it, the job's one task runs in Kubernetes mode with
    no TF_CONFIG and no Service (the operator's isDistributed), and its command gets the replica's `secretKeyRef` env
    from a Secret in the API stand-in (read over HTTPS as the kubelet would, for the task whose compiled `secretAsEnv`
    names it)."""
    import ast
    import base64
    import hashlib
    import secrets
    import shutil

    import docker
    import yaml
    from kfp import local
    from kubernetes import client as k8s_client

    from pipelines.jobs import tfjob_pipeline
    from trainer.command.tfjob_spec import read_manifest

    client, network, stand_in, image = cluster
    try:
        client.images.get(TFJOB_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"the engine has no image {TFJOB_IMAGE}: `make e2e` builds it")
    probe = client.containers.run(
        TFJOB_IMAGE,
        ["python", "-c", "import importlib.metadata as m; print([d.metadata['Name'] for d in m.distributions()])"],
        remove=True,
        network_mode="none",
    ).decode()
    installed = {name.lower() for name in ast.literal_eval(probe)}
    assert "tensorflow" in installed and "tensorflow-cpu" not in installed, "a plain TensorFlow base, not ours"
    token = secrets.token_hex(16)
    api = k8s_client.CoreV1Api(k8s_client.ApiClient(stand_in.files.configuration(stand_in.https.port)))
    api.create_namespaced_secret(
        e2e_cluster.NAMESPACE,
        {"metadata": {"name": "e2e-api"}, "data": {"token": base64.b64encode(token.encode()).decode()}},
    )
    pod_image = e2e_cluster.pod_image(client, TFJOB_IMAGE, stand_in)
    try:
        root = e2e_cluster.pipeline_root()
        shutil.copytree(Path(__file__).parents[1] / "data" / "mnist-sample", root / "data")
        job = read_manifest(yaml.safe_load(SECRET_TFJOB.format(image=pod_image, data=root / "data")))
        pipeline = tfjob_pipeline(job, image)
        stand_in.api.calls.clear()
        given = e2e_cluster.apply_secrets_as_env(pipeline, stand_in)
        assert given == {"exec-run-command": ["API_TOKEN"]}, "only the replica's task gets the Secret"
        assert [(c.verb, c.resource, c.name) for c in stand_in.api.calls] == [("get", "secrets", "e2e-api")]
        local.init(runner=e2e_cluster.docker_runner(network, stand_in), pipeline_root=str(root), raise_on_error=False)
        result = pipeline(cluster_mode="kubernetes")
        logs = capfd.readouterr().out
        digest = hashlib.sha256(token.encode()).hexdigest()
        assert f"API_TOKEN sha256 {digest}, DATA_SOURCE mnist-sample" in logs, logs[-4000:]
        assert token not in logs
        # One task in all: as under the operator (isDistributed), no TF_CONFIG and no cluster to join.
        assert re.search(r"worker 0 runs .*? with no TF_CONFIG \(one task in all, as under TFJob\)$", logs, re.M), logs[
            -4000:
        ]
        assert re.search(r"test accuracy 0\.\d+", logs), logs[-4000:]
        model = Path(result.output.path)
        assert (model / "saved_model" / "saved_model.pb").is_file(), logs[-4000:]
        assert [c for c in stand_in.api.calls if c.resource == "services"] == [], "no Service for a lone task"
    finally:
        client.images.remove(pod_image, force=True)
        api.delete_namespaced_secret("e2e-api", e2e_cluster.NAMESPACE)
    with capfd.disabled():
        print("\ne2e TFJob in a plain TensorFlow image: the task ran, the Secret reached its command")
