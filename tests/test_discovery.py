"""Joining a run on Kubernetes: the real `kubernetes` client against the API stand-in, names resolved by asking the
stand-in's DNS server over UDP on loopback (the way a pod's resolver would ask cluster DNS).
"""

import time
from datetime import datetime, timezone

import pytest
import yaml

from tests.standins.dns import DnsServer, query
from tests.standins.kube import Call, KubeStandIn
from tests.support.paths import ROOT
from trainer.cluster import configmap_status, discovery
from trainer.core.errors import StartupTimeoutError
from trainer.k8s import checkpoints, objects
from trainer.training import parameter_server as ps

RUN_ID = "7c1e5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
NS = "team-a"
SPEC = {"worker": objects.task_addresses(RUN_ID, 2, NS, 2222)}
WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "mnist-multiworker-q9z"}}
UNSCHEDULABLE = (
    "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found."
)


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch):
    """Polls every 0.2 s instead of every second, so the waits below take what they must and no more."""
    monkeypatch.setattr(discovery, "POLL_SECONDS", 0.2)


@pytest.fixture
def cluster(httpserver, monkeypatch):
    """The API stand-in (pods it learns get Argo's and KFP's labels), its DNS server, and this pod's identity."""
    standin = KubeStandIn(
        pod_labels={objects.WORKFLOW_LABEL: WORKFLOW["metadata"]["name"], objects.KFP_RUN_LABEL: RUN_ID}
    )
    standin.install(httpserver)
    standin.add("workflows.argoproj.io", NS, WORKFLOW)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    monkeypatch.setenv("POD_NAME", "mnist-multiworker-q9z-system-container-impl-1001")
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    with DnsServer(standin.dns_records, "127.0.0.1", 0) as dns:

        def resolve(host):
            return {str(r.rdata) for r in query(f"{host}.cluster.local", "127.0.0.1", dns.port).rr}

        yield standin, objects.core_api(host=httpserver.url_for("").rstrip("/")), resolve


def _peer_joined(standin, index, ip="198.18.3.7"):
    """What a peer's own join does: its Service and its labelled pod (with the IP the kubelet gave it)."""
    standin.add("services", NS, objects.service_manifest(RUN_ID, index, 2222))
    standin.add_pod(NS, f"peer-{index}", labels=objects.pod_labels(RUN_ID, index), ip=ip)


def test_join_creates_the_service_labels_the_pod_and_waits_for_its_own_name_too(cluster):
    standin, api, resolve = cluster
    _peer_joined(standin, 1)
    position = discovery.join_cluster(
        SPEC, "worker", 0, RUN_ID, timeout=10, unschedulable_timeout=60, api=api, resolve=resolve
    )
    assert position == 0
    own = standin.get("services", NS, objects.service_name(RUN_ID, 0))
    assert (
        own["metadata"]["ownerReferences"][0]["uid"]
        == standin.get("workflows.argoproj.io", NS, WORKFLOW["metadata"]["name"])["metadata"]["uid"]
    )
    pod = "mnist-multiworker-q9z-system-container-impl-1001"
    assert standin.calls[:4] == [
        Call("get", "pods", NS, pod),
        Call("get", "workflows.argoproj.io", NS, WORKFLOW["metadata"]["name"]),
        Call("create", "services", NS, None),
        Call("patch", "pods", NS, pod),
    ]
    assert resolve(SPEC["worker"][0].split(":")[0]) == {"127.0.0.1"}, "its own name leads to its own pod IP"
    discovery.leave_cluster(RUN_ID, position, api=api)
    assert standin.get("services", NS, objects.service_name(RUN_ID, 0)) is None
    assert standin.get("services", NS, objects.service_name(RUN_ID, 1)) is not None, "a task deletes only its own"


def test_own_name_pointing_elsewhere_is_not_enough(cluster, monkeypatch):
    standin, api, resolve = cluster
    _peer_joined(standin, 1)
    monkeypatch.setenv("POD_IP", "198.18.3.99")
    with pytest.raises(
        StartupTimeoutError,
        match=r"worker 0 \(this pod\) at tfw-\S+: the name does not resolve to "
        r"this pod's IP 198\.18\.3\.99 yet",
    ):
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=0.3, unschedulable_timeout=60, api=api, resolve=resolve
        )


def test_a_missing_peer_is_named_with_what_its_pod_is_doing(cluster):
    standin, api, resolve = cluster
    standin.add_pod(
        NS,
        "mnist-multiworker-q9z-system-container-impl-2002",
        labels={objects.KFP_RUN_LABEL: RUN_ID},
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "True"}],
    )
    started = time.monotonic()
    with pytest.raises(StartupTimeoutError) as err:
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=0.3, unschedulable_timeout=60, api=api, resolve=resolve
        )
    assert time.monotonic() - started < 10
    message = str(err.value)
    assert f"names did not resolve within 0.3s: worker 1 at {SPEC['worker'][1]}: no pod has joined yet" in message
    assert "pods of this run not running: mnist-multiworker-q9z-system-container-impl-2002 Pending" in message


def test_an_unschedulable_peer_fails_the_join_early_with_the_schedulers_reason(cluster):
    standin, api, resolve = cluster
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    standin.add_pod(
        NS,
        "mnist-multiworker-q9z-system-container-impl-3003",
        labels={objects.KFP_RUN_LABEL: RUN_ID},
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": UNSCHEDULABLE,
                "lastTransitionTime": since,
            }
        ],
    )
    started = time.monotonic()
    with pytest.raises(StartupTimeoutError) as err:
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=600, unschedulable_timeout=2, api=api, resolve=resolve
        )
    waited = time.monotonic() - started
    assert 1 <= waited < 12, f"failed after {waited:.1f}s: at the unschedulable timeout, not at the start-up timeout"
    message = str(err.value)
    assert "pods of this run unschedulable for more than 2s" in message
    assert f"mnist-multiworker-q9z-system-container-impl-3003 Pending: {UNSCHEDULABLE}" in message
    assert f"worker 1 at {SPEC['worker'][1]}: no pod has joined yet" in message


def test_a_peer_that_joined_but_does_not_resolve_is_named_with_its_pod(cluster):
    standin, api, resolve = cluster
    standin.add_pod(
        NS,
        "peer-1",
        labels=objects.pod_labels(RUN_ID, 1),
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "True"}],
    )
    with pytest.raises(
        StartupTimeoutError,
        match=rf"worker 1 at {SPEC['worker'][1]}: pod peer-1 Pending, the name does "
        "not resolve yet",
    ):
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=0.3, unschedulable_timeout=60, api=api, resolve=resolve
        )


def test_without_permission_to_list_pods_the_join_still_names_the_missing_peer(httpserver, monkeypatch, caplog):
    role = {
        "rules": [
            {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        ]
    }
    standin = KubeStandIn(role=role)
    standin.install(httpserver)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    monkeypatch.setenv("POD_NAME", "pod-0")
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    api = objects.core_api(host=httpserver.url_for("").rstrip("/"))
    with pytest.raises(StartupTimeoutError, match="no pod has joined yet"):
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=0.3, unschedulable_timeout=60, api=api, resolve=lambda host: set()
        )
    assert "cannot list pods to say why a peer is missing: HTTP 403" in caplog.text
    assert "its Service will not be owned by the run" in caplog.text


@pytest.mark.parametrize("path", sorted(ROOT.joinpath("deploy").glob("rbac-*.yaml")), ids=lambda p: p.name)
def test_the_rbac_roles_grant_exactly_what_a_training_step_calls(httpserver, monkeypatch, path):
    """A join that has to explain a missing peer, then a successful join and the leave, under the shipped Role."""
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
    standin = KubeStandIn(role=role, pod_labels={objects.WORKFLOW_LABEL: WORKFLOW["metadata"]["name"]})
    standin.install(httpserver)
    standin.add("workflows.argoproj.io", NS, WORKFLOW)
    monkeypatch.setenv("POD_NAMESPACE", NS)
    monkeypatch.setenv("POD_NAME", "pod-0")
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    api = objects.core_api(host=httpserver.url_for("").rstrip("/"))
    with pytest.raises(StartupTimeoutError):
        discovery.join_cluster(
            SPEC, "worker", 0, RUN_ID, timeout=0.1, unschedulable_timeout=60, api=api, resolve=lambda host: set()
        )
    position = discovery.join_cluster(
        SPEC, "worker", 0, RUN_ID, timeout=5, unschedulable_timeout=60, api=api, resolve=lambda host: {"127.0.0.1"}
    )
    discovery.leave_cluster(RUN_ID, position, api=api)
    assert standin.items("services") == {}
    # the parameter-server status (chief writes, servers read) and the checkpoint claim's access modes
    store = configmap_status.ConfigMapStatus(configmap_status.configmap_name(RUN_ID), RUN_ID, api=api)
    with ps.StatusPublisher(store):
        pass
    ps.wait_for_chief(configmap_status.ConfigMapStatus(store.name, RUN_ID, api=api), 5, 30, "ps 0")
    standin.add(
        "persistentvolumeclaims", NS, {"metadata": {"name": "ckpt"}, "spec": {"accessModes": ["ReadWriteMany"]}}
    )
    checkpoints.check_claim("ckpt", api)
    used = {(call.resource, call.verb) for call in standin.calls}
    granted = {
        (r if not g else f"{r}.{g}", v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    # The deploy step's rules (KServe's InferenceServices and its storage credentials) are checked by
    # tests/test_serving_deploy.py; every other rule is here.
    deploys = ("secrets", "serviceaccounts")
    assert used == {(r, v) for r, v in granted if not r.endswith(".serving.kserve.io") and r not in deploys}, path.name
