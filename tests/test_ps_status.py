"""The parameter-server status on a ConfigMap of the run, through the real `kubernetes` client and the API stand-in.

In-process, and from real chief, ps and worker processes, which find the stand-in through KUBECONFIG.
"""

import json
import os
import re
import signal
import time

import pytest

from tests.standins.kube import Call, KubeStandIn, write_kubeconfig
from tests.support.processes import launch, processes_alive, trainer_args
from tests.support.ps_cluster import kill_one
from trainer.cluster import configmap_status
from trainer.config.contract import ClusterConfig, RuntimeConfig, TrainConfig
from trainer.core.errors import EXIT_PEER_UNAVAILABLE, ChiefFailedError, KubernetesError, PeerUnavailableError
from trainer.evaluation.metrics import evaluate
from trainer.k8s import objects
from trainer.records.history import History
from trainer.training import parameter_server as ps

RUN_ID = "5d3c0a1e-9b2f-4f6e-8a7d-1c2b3a4d5e6f"
NS = "team-a"
WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "mnist-parameter-server-x"}}
POD = "mnist-parameter-server-x-system-container-impl-1"


@pytest.fixture
def cluster(httpserver, monkeypatch):
    """The API stand-in with the run's Workflow; its pods carry Argo's label, as a run's pods do."""
    standin = KubeStandIn(pod_labels={objects.WORKFLOW_LABEL: WORKFLOW["metadata"]["name"]})
    standin.install(httpserver)
    standin.add("workflows.argoproj.io", NS, WORKFLOW)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    monkeypatch.setenv("POD_NAME", POD)
    return standin, httpserver.url_for("").rstrip("/")


def _store(url, name=None):
    return configmap_status.ConfigMapStatus(
        name or configmap_status.configmap_name(RUN_ID), RUN_ID, api=objects.core_api(host=url)
    )


def test_the_chief_keeps_its_status_on_a_configmap_owned_by_the_run(cluster):
    standin, url = cluster
    name = configmap_status.configmap_name(RUN_ID)
    with ps.StatusPublisher(_store(url)):
        found = standin.get("configmaps", NS, name)
        assert json.loads(found["data"]["status.json"])["state"] == "running"
        workflow = standin.get("workflows.argoproj.io", NS, WORKFLOW["metadata"]["name"])
        assert found["metadata"]["ownerReferences"][0]["uid"] == workflow["metadata"]["uid"]
        assert found["metadata"]["labels"][objects.RUN_LABEL] == objects.run_key(RUN_ID)
        deadline = time.monotonic() + 60
        while Call("patch", "configmaps", NS, name) not in standin.calls:  # the heartbeat's first refresh
            assert time.monotonic() < deadline, "the chief never refreshed its heartbeat"
            time.sleep(0.1)
    ps.wait_for_chief(_store(url), 5, 30, "ps 0")
    assert Call("create", "configmaps", NS, None) in standin.calls
    assert Call("patch", "configmaps", NS, name) in standin.calls, "the heartbeat and the final state are patches"
    assert Call("get", "configmaps", NS, name) in standin.calls, "servers read it through the API"
    standin_delete(standin, url)
    assert standin.get("configmaps", NS, name) is None, "deleting the run's Workflow deletes its status"


def standin_delete(standin, url):
    from kubernetes import client

    api = client.CustomObjectsApi(objects.core_api(host=url).api_client)
    api.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", WORKFLOW["metadata"]["name"])


def test_states_and_heartbeats_on_the_configmap_decide_the_servers_exit(cluster):
    standin, url = cluster
    with pytest.raises(PeerUnavailableError, match=r"worker 0: the chief published no status at configmap team-a/"):
        ps.wait_for_chief(_store(url), 1, 30, "worker 0")
    with pytest.raises(RuntimeError), ps.StatusPublisher(_store(url)):
        raise RuntimeError("out of memory on the chief")
    with pytest.raises(ChiefFailedError, match="ps 0: the chief failed: out of memory on the chief"):
        ps.wait_for_chief(_store(url), 5, 30, "ps 0")
    stale = {"state": "running", "heartbeat": time.time() - 100, "detail": ""}
    standin.add("configmaps", NS, {"metadata": {"name": "stale"}, "data": {"status.json": json.dumps(stale)}})
    stale_line = r"worker 1: the chief's heartbeat at configmap team-a/stale is 1\d\ds old \(limit 2s\)"
    with pytest.raises(PeerUnavailableError, match=stale_line):
        ps.wait_for_chief(_store(url, "stale"), 5, 2, "worker 1")


def test_a_retried_chief_takes_over_its_configmap(cluster):
    standin, url = cluster
    with pytest.raises(RuntimeError), ps.StatusPublisher(_store(url)):
        raise RuntimeError("first attempt")
    with ps.StatusPublisher(_store(url)):
        found = json.loads(
            standin.get("configmaps", NS, configmap_status.configmap_name(RUN_ID))["data"]["status.json"]
        )
        assert found["state"] == "running"


def test_a_forbidden_configmap_is_one_line_naming_verb_and_resource(httpserver, monkeypatch):
    KubeStandIn(role={"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}).install(httpserver)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    with pytest.raises(KubernetesError, match="may not create configmaps in namespace 'team-a'"):
        ps.StatusPublisher(_store(httpserver.url_for("").rstrip("/"))).__enter__()


def test_kubernetes_mode_puts_the_status_on_the_runs_configmap_and_a_given_uri_is_made_the_runs_own():
    runtime = RuntimeConfig(data_dir="d", model_dir="m", run_id=RUN_ID)
    config = TrainConfig(runtime, cluster=ClusterConfig(strategy="parameter_server", cluster_mode="kubernetes"))
    assert ps.status_uri(config) == f"configmap:tfw-{objects.run_key(RUN_ID)}-status"
    assert ps.status_uri(config.replace(status_uri="gs://b/s.json")) == f"gs://b/{objects.run_key(RUN_ID)}/s.json"
    assert ps.status_uri(config.replace(cluster_mode="local")) == f"m.status/{objects.run_key(RUN_ID)}.json"


def _kubeconfig(tmp_path, url):
    path = write_kubeconfig(tmp_path / "kubeconfig", url, NS)
    return {"KUBECONFIG": str(path), "POD_NAMESPACE": NS, "POD_NAME": POD, "KUBERNETES_SERVICE_HOST": ""}


@pytest.mark.slow  # chief, ps and workers as processes
def test_a_lost_worker_is_replaced_the_chief_carries_on_and_all_exit_zero_through_the_configmap(
    cluster, sample_data, tmp_path
):
    """chief, ps 0 and workers 0 and 1 through trainer-launch, the status on the run's ConfigMap (found through
    KUBECONFIG); worker 1's whole process is killed after epoch 2 and replaced, as a lost pod is re-created."""
    standin, url = cluster
    name = configmap_status.configmap_name(RUN_ID)
    args = trainer_args(sample_data, tmp_path / "model", "--epochs", "6", "--run-id", RUN_ID)
    args += ["--status-uri", f"configmap:{name}"]
    launcher = launch("--workers", "2", "--ps", "1", "--max-restarts", "1", "--", *args, env=_kubeconfig(tmp_path, url))
    try:
        pid = int(launcher.wait_for(r"started worker 1 \(pid (\d+)\)", 60).group(1))
        launcher.wait_for(r"^\[chief 0\] .*epoch 2:", 180)
        os.kill(pid, signal.SIGKILL)  # the whole task, as when its pod is lost
        launcher.wait_for(r"worker 1 was killed by signal 9 .*starting a replacement \(1 of 1\)", 60)
        code = launcher.finish(400)
    finally:
        launcher.kill()
    text = "\n".join(launcher.lines)
    assert code == 0, text[-4000:]
    assert len(re.findall(r"^\[worker 1\] .*server started at ", text, re.M)) == 2, "the replacement served again"
    for label in ("ps 0", "worker 0", "worker 1"):
        assert re.search(rf"^\[{label}\] .*the chief finished successfully; exiting", text, re.M), label
    pids = [int(p) for p in re.findall(r"server started at \S+ \(pid (\d+)\)", text)]
    assert len(pids) == 4 and processes_alive(pids) == [], "no process is left running"
    own = f"{name}-{objects.run_key(RUN_ID)}"
    assert json.loads(standin.get("configmaps", NS, own)["data"]["status.json"])["state"] == "succeeded"
    assert not (tmp_path / "model.status").exists(), "no status file: the servers read the ConfigMap"
    history = History.read(str(tmp_path / "model"))
    assert (history.strategy, history.parameter_servers, history.workers) == ("parameter_server", 1, 2)
    assert [e["epoch"] for e in history.epochs] == list(range(1, 7))
    assert evaluate(str(tmp_path / "model"), sample_data).accuracy >= 0.95


@pytest.mark.slow  # chief, ps and workers as processes
def test_killing_the_chief_ends_ps_and_workers_with_138_within_the_timeout(cluster, sample_data, tmp_path):
    standin, url = cluster
    procs, codes, elapsed = kill_one(sample_data, tmp_path, "configmap:ps-status", _kubeconfig(tmp_path, url))
    assert set(codes.values()) == {EXIT_PEER_UNAVAILABLE}, codes
    assert elapsed < 8 + 60, "the servers end once the chief's heartbeat is older than chief_timeout (8 s)"
    own = f"ps-status-{objects.run_key('ps-1')}"
    for key in codes:
        assert any(f"the chief's heartbeat at configmap team-a/{own}" in line for line in procs[key].lines), key
    assert json.loads(standin.get("configmaps", NS, own)["data"]["status.json"])["state"] == "running"


def test_the_chief_states_are_the_documents_words_and_only_running_goes_on():
    from trainer.cluster.status import ChiefState, ChiefStatus

    assert {s.name: s.value for s in ChiefState} == {"RUNNING": "running", "SUCCEEDED": "succeeded", "FAILED": "failed"}
    assert {s: s.is_terminal for s in ChiefState} == {
        ChiefState.RUNNING: False,
        ChiefState.SUCCEEDED: True,
        ChiefState.FAILED: True,
    }
    status = ChiefStatus(ChiefState.FAILED, 1700000000.5, "out of memory")
    assert status.to_document() == {"state": "failed", "heartbeat": 1700000000.5, "detail": "out of memory"}
    assert ChiefStatus.from_document(status.to_document()) == status
    assert ChiefStatus.from_document({"state": "running", "heartbeat": 7}) == ChiefStatus(ChiefState.RUNNING, 7.0, "")
    with pytest.raises(ValueError, match=r"^the chief's status names the state 'done'; allowed: running, succeeded, "):
        ChiefStatus.from_document({"state": "done", "heartbeat": 7})


def test_the_status_document_on_the_configmap_and_in_a_file_is_byte_for_byte_the_same_as_before(cluster, tmp_path):
    from trainer.cluster.status import ChiefState, ChiefStatus, FileStatus

    standin, url = cluster
    _store(url).write_status(ChiefStatus(ChiefState.SUCCEEDED, 1700000000.5))
    found = standin.get("configmaps", NS, configmap_status.configmap_name(RUN_ID))["data"]
    assert found == {"status.json": '{"detail": "", "heartbeat": 1700000000.5, "state": "succeeded"}'}
    assert _store(url).read_status() == ChiefStatus(ChiefState.SUCCEEDED, 1700000000.5, "")
    FileStatus(str(tmp_path / "status.json")).write_status(ChiefStatus(ChiefState.RUNNING, 12.25, "x"))
    written = (tmp_path / "status.json").read_text()
    assert written == '{\n  "detail": "x",\n  "heartbeat": 12.25,\n  "state": "running"\n}\n'


def test_a_status_naming_a_state_no_chief_writes_is_an_unreadable_status(tmp_path):
    from trainer.cluster.status import FileStatus

    (tmp_path / "status.json").write_text(json.dumps({"state": "done", "heartbeat": time.time()}))
    with pytest.raises(
        PeerUnavailableError,
        match=r"^ps 0: the chief's status at \S+ could not be read for 0.5s: the chief's status names the state 'done'",
    ):
        ps.wait_for_chief(FileStatus(str(tmp_path / "status.json")), 5, 0.5, "ps 0")
