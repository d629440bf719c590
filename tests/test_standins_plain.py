"""The project's own Kubernetes code against the API stand-in over plain HTTP, and the stand-in's label selectors."""

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.standins.cluster import StandInCluster
from tests.standins.dns import query
from tests.standins.incluster import SERVICEACCOUNT_MOUNT
from tests.standins.kube import Call, KubeStandIn
from tests.standins.objects import label_matcher
from tests.support.paths import ROOT
from trainer.core.errors import KubernetesError
from trainer.k8s import objects

RUN_ID = "0b6f5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
NS = "team-a"
SVC0, SVC1 = objects.service_name(RUN_ID, 0), objects.service_name(RUN_ID, 1)
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient cpu."


def _ips(reply):
    return sorted(str(r.rdata) for r in reply.rr)


@pytest.fixture
def plain(httpserver):
    """The API stand-in under pytest-httpserver (plain HTTP), and the project's own client for it."""
    standin = KubeStandIn(token="t0k3n")
    standin.install(httpserver)
    return standin, objects.core_api(host=httpserver.url_for("").rstrip("/"), token="t0k3n")


def test_project_code_over_plain_http_makes_and_removes_dns_names(plain):
    standin, api = plain
    addresses = objects.task_addresses(RUN_ID, 2, NS)
    for index in range(2):
        objects.ensure_service(api, NS, RUN_ID, index, 2222, None)
        objects.label_own_pod(api, NS, f"train-worker-{index}", RUN_ID, index)
    assert standin.dns_records() == {f"{a.split(':')[0]}.cluster.local": ["127.0.0.1"] for a in addresses}
    for index in range(2):
        assert objects.delete_service(api, NS, RUN_ID, index)
    assert standin.dns_records() == {}
    assert standin.calls == [
        call
        for i, svc in enumerate((SVC0, SVC1))
        for call in (Call("create", "services", NS, None), Call("patch", "pods", NS, f"train-worker-{i}"))
    ] + [Call("delete", "services", NS, SVC0), Call("delete", "services", NS, SVC1)]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy").glob("rbac-*.yaml")), ids=lambda p: p.name)
def test_the_shipped_role_is_enforced_and_is_enough(httpserver, path):
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
    standin = KubeStandIn(role=role)
    standin.install(httpserver)
    api = objects.core_api(host=httpserver.url_for("").rstrip("/"))
    objects.label_own_pod(api, NS, "train-worker-0", RUN_ID, 0)
    objects.ensure_service(api, NS, RUN_ID, 0, 2222, objects.workflow_owner(api, NS, "train-worker-0"))
    assert objects.delete_service(api, NS, RUN_ID, 0)
    with pytest.raises(ApiException) as err:
        api.delete_namespaced_pod("train-worker-0", NS)
    assert err.value.status == 403
    standin.role = {"rules": [r for r in role["rules"] if "pods" not in r["resources"]]}
    with pytest.raises(KubernetesError, match="may not patch pods"):
        objects.label_own_pod(api, NS, "train-worker-0", RUN_ID, 0)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("a=1,b==2", {"a": "1", "b": "2"}, True),
        ("a=1,b==2", {"a": "1"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),!c", {"a": "2"}, True),
        ("a notin (1,2)", {"a": "2"}, False),
        ("a", {"a": ""}, True),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selectors(selector, labels, matches):
    assert label_matcher(selector)(labels) is matches


def test_the_whole_stand_in_cluster_and_what_a_pod_gets(tmp_path):
    with StandInCluster.start(tmp_path, "127.0.0.1", namespace=NS, dns_port=0) as cluster:
        core = client.CoreV1Api(client.ApiClient(cluster.files.configuration(cluster.https.port)))
        core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, 0))
        core.patch_namespaced_pod("train-worker-0", NS, {"metadata": {"labels": objects.pod_labels(RUN_ID, 0)}})
        assert _ips(query(f"{SVC0}.{NS}.svc.cluster.local", "127.0.0.1", cluster.dns.port)) == ["127.0.0.1"]
        env = cluster.pod_env("train-worker-0")
        args = cluster.docker_args("train-worker-0")
        resolver = cluster.resolv_conf()
    assert env == {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(cluster.https.port),
        "POD_NAME": "train-worker-0",
        "POD_NAMESPACE": NS,
    }
    assert resolver == (
        f"search {NS}.svc.cluster.local svc.cluster.local cluster.local\nnameserver 127.0.0.1\noptions ndots:5\n"
    )
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--dns", "127.0.0.1") in pairs and ("--dns-opt", "ndots:5") in pairs
    searched = [v for k, v in pairs if k == "--dns-search"]
    assert searched == [f"{NS}.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    assert ("--mount", f"type=bind,src={cluster.files.serviceaccount},dst={SERVICEACCOUNT_MOUNT},readonly") in pairs
    assert sorted(v for k, v in pairs if k == "--env") == sorted(f"{k}={v}" for k, v in env.items())
