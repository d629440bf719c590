"""The run's Kubernetes objects: the real `kubernetes` client over real HTTP against the API stand-in."""

import re

import kubernetes_validate
import pytest
import yaml

from tests.standins.kube import Call, KubeStandIn
from tests.support.kubernetes import K8S_VERSION
from tests.support.paths import ROOT
from trainer.cluster.topology import next_port
from trainer.core.errors import KubernetesError, UsageError
from trainer.k8s import objects

RUN_ID = "0b6f5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
WORKFLOW = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "mnist-multiworker-x7k2p"}}


@pytest.fixture
def standin(httpserver):
    fake = KubeStandIn(forbidden_namespaces={"locked"})
    fake.install(httpserver)
    return fake


@pytest.fixture
def api(httpserver):
    return objects.core_api(host=httpserver.url_for("").rstrip("/"), token="test-token")


def test_names_are_short_dns_labels_unique_per_run():
    name = objects.service_name(RUN_ID, 2)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 20
    assert name == objects.service_name(RUN_ID, 2), "stable across retries"
    assert objects.service_name("another-run", 2) != name
    assert objects.task_addresses(RUN_ID, 2, "team-a", 2222) == [
        f"{objects.service_name(RUN_ID, 0)}.team-a.svc:2222",
        f"{objects.service_name(RUN_ID, 1)}.team-a.svc:2222",
    ]
    assert next_port("tfw-r1-0.team-a.svc:2222") == "tfw-r1-0.team-a.svc:2223"


def test_a_task_creates_its_headless_service_owned_by_the_run(standin, api, httpserver):
    workflow = standin.add("workflows.argoproj.io", "team-a", WORKFLOW)
    standin.add_pod(
        "team-a",
        "mnist-x7k2p-system-container-impl-1",
        labels={objects.WORKFLOW_LABEL: "mnist-multiworker-x7k2p", objects.KFP_RUN_LABEL: RUN_ID},
    )
    owner = objects.workflow_owner(api, "team-a", "mnist-x7k2p-system-container-impl-1")
    assert owner == {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": "mnist-multiworker-x7k2p",
        "uid": workflow["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }
    assert objects.ensure_service(api, "team-a", RUN_ID, 1, 2222, owner) is True
    body = standin.get("services", "team-a", objects.service_name(RUN_ID, 1))
    assert body["spec"]["clusterIP"] == "None" and body["spec"]["publishNotReadyAddresses"] is True
    assert body["spec"]["selector"] == {
        "app.kubernetes.io/name": "kfp-tf-multiworker",
        "tf-multiworker.kubeflow.org/run": objects.run_key(RUN_ID),
        "tf-multiworker.kubeflow.org/worker-index": "1",
    }
    assert body["spec"]["ports"] == [{"name": "tf-grpc", "port": 2222, "targetPort": 2222, "protocol": "TCP"}]
    assert body["metadata"]["labels"]["pipelines.kubeflow.org/run-id"] == RUN_ID
    assert body["metadata"]["ownerReferences"] == [owner]
    request, _ = next((r, s) for r, s in httpserver.log if r.method == "POST")
    assert request.headers["Authorization"] == "Bearer test-token"
    from kubernetes import client

    client.CustomObjectsApi(api.api_client).delete_namespaced_custom_object(
        "argoproj.io", "v1alpha1", "team-a", "workflows", WORKFLOW["metadata"]["name"]
    )
    assert standin.items("services") == {}, "deleting the run's Workflow removes the Services it owns"


def test_without_a_workflow_the_service_is_still_created_with_a_warning(standin, api, caplog):
    standin.add_pod("team-a", "lonely-pod")
    assert objects.workflow_owner(api, "team-a", "lonely-pod") is None
    assert "has no workflows.argoproj.io/workflow label" in caplog.text
    standin.forbidden.add("locked")
    assert objects.workflow_owner(api, "locked", "any-pod") is None
    assert "HTTP 403" in caplog.text


def test_a_retried_task_keeps_its_service_and_a_missing_one_comes_back(standin, api):
    assert objects.ensure_service(api, "team-a", RUN_ID, 0, 2222, None) is True
    assert objects.ensure_service(api, "team-a", RUN_ID, 0, 2222, None) is False
    assert objects.delete_service(api, "team-a", RUN_ID, 0) is True
    assert objects.delete_service(api, "team-a", RUN_ID, 0) is False, "deleting twice is fine"
    assert objects.ensure_service(api, "team-a", RUN_ID, 0, 2222, None) is True, "a KFP Retry re-creates it"
    assert list(standin.items("services")) == [("team-a", objects.service_name(RUN_ID, 0))]


def test_pod_label_matches_its_service_selector_and_dns_follows(standin, api):
    for index in range(2):
        objects.ensure_service(api, "team-a", RUN_ID, index, 2222, None)
    objects.label_own_pod(api, "team-a", "mnist-xyz-train-worker-123", RUN_ID, 1)
    labels = standin.get("pods", "team-a", "mnist-xyz-train-worker-123")["metadata"]["labels"]
    assert (
        standin.get("services", "team-a", objects.service_name(RUN_ID, 1))["spec"]["selector"].items() <= labels.items()
    )
    assert standin.dns_records() == {f"{objects.service_name(RUN_ID, 1)}.team-a.svc.cluster.local": ["127.0.0.1"]}


def test_forbidden_names_verb_resource_and_namespace(standin, api):
    with pytest.raises(KubernetesError, match=r"may not create services in namespace 'locked'"):
        objects.ensure_service(api, "locked", RUN_ID, 0, 2222, None)
    with pytest.raises(KubernetesError, match=r"may not patch pods in namespace 'locked'"):
        objects.label_own_pod(api, "locked", "pod-1", RUN_ID, 0)
    with pytest.raises(KubernetesError, match=r"may not delete services in namespace 'locked'"):
        objects.delete_service(api, "locked", RUN_ID, 0)
    assert Call("create", "services", "locked", None) in standin.calls


def _manifests(path):
    return [d for d in yaml.safe_load_all(path.read_text().replace("NAMESPACE", "kubeflow-user-example-com")) if d]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy").glob("rbac-*.yaml")), ids=lambda p: p.name)
def test_deploy_roles_validate_against_kubernetes_schemas(path):
    docs = _manifests(path)
    assert {d["kind"] for d in docs} == {"Role", "RoleBinding"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] in {"default-editor", "pipeline-runner"}


def test_the_network_policy_validates_and_opens_the_training_and_control_ports_between_training_pods():
    from pipelines.pods import TRAINING
    from trainer.config import settings

    assert {p.name for p in (ROOT / "deploy").glob("*.yaml")} == {
        "rbac-kubeflow-multi-user.yaml",
        "rbac-standalone-kfp.yaml",
        "networkpolicy.yaml",
    }
    (policy,) = _manifests(ROOT / "deploy" / "networkpolicy.yaml")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    label = dict([TRAINING])
    assert policy["spec"]["podSelector"]["matchLabels"] == label
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": label}}], "only from the pipeline's training pods"
    port = settings.default("port")
    assert [(p["protocol"], p["port"]) for p in rule["ports"]] == [("TCP", port), ("TCP", port + 1)]
    assert label.items() <= objects.pod_labels("run-1", 0).items(), "the label the pods also give themselves"


def test_service_bodies_validate_against_kubernetes_schemas():
    owner = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": "w",
        "uid": "1-2-3",
        "blockOwnerDeletion": False,
    }
    for index in range(3):
        kubernetes_validate.validate(objects.service_manifest(RUN_ID, index, 2222, owner), K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: objects.task_addresses(RUN_ID, 0, "ns"), "tasks 0 is not allowed; allowed: an integer from 1 to 64"),
        (lambda: objects.task_addresses(RUN_ID, 65, "ns"), "tasks 65 is not allowed"),
        (
            lambda: objects.task_addresses(RUN_ID, 2, "ns", 65535),
            "port 65535 is not allowed; allowed: an integer from 1 to 65534",
        ),
        (lambda: objects.service_name("", 0), "run id is empty"),
        (lambda: objects.label_own_pod(None, "ns", "", RUN_ID, 0), "the pod name is empty"),
    ],
)
def test_bad_inputs(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def test_pod_name_and_namespace_come_from_the_downward_api_or_the_pod_itself(monkeypatch, tmp_path):
    import socket

    monkeypatch.delenv("POD_NAME", raising=False)
    assert objects.pod_name() == socket.gethostname(), "Kubernetes sets a pod's host name to its name"
    monkeypatch.setenv("POD_NAME", "train-worker-0")
    assert objects.pod_name() == "train-worker-0"
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    assert objects.namespace() == "team-a"
    monkeypatch.delenv("POD_NAMESPACE")
    (tmp_path / "namespace").write_text("team-b\n")
    monkeypatch.setattr(objects, "NAMESPACE_FILE", str(tmp_path / "namespace"))
    assert objects.namespace() == "team-b"


# /proc/self/mountinfo of a KFP task's pod: the container's overlay root, the kubelet's files, a claim at /models.
POD_MOUNTINFO = """\
1200 1100 0:310 / / rw,relatime master:400 - overlay overlay rw,lowerdir=/var/lib/containerd/l1,upperdir=/u,workdir=/w
1201 1200 0:312 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1210 1200 253:1 /var/lib/kubelet/pods/p/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
1211 1200 0:300 / /var/run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw,size=4Gi
1212 1200 0:64 / /models rw,relatime - nfs4 fs.example.com:/exports/team rw
1213 1200 0:65 / /gcs\\040fuse rw,relatime - fuse gcsfuse rw
"""


def test_a_path_on_a_pods_own_disk_is_told_from_one_on_a_volume():
    from trainer.k8s.volumes import mount_point, on_own_disk

    assert on_own_disk("/tmp/published", POD_MOUNTINFO)
    assert on_own_disk("/modelsx/v1", POD_MOUNTINFO)
    assert not on_own_disk("/models/mnist", POD_MOUNTINFO)
    assert mount_point("/gcs fuse/a", POD_MOUNTINFO) == "/gcs fuse"
    assert mount_point("/etc/hosts", POD_MOUNTINFO) == "/etc/hosts"


def test_publishing_from_a_pod_to_its_own_disk_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from trainer import steps
    from trainer.k8s import volumes

    monkeypatch.setenv("POD_NAMESPACE", "team")
    monkeypatch.setattr(volumes, "MOUNTINFO", str(tmp_path / "mountinfo"))
    (tmp_path / "mountinfo").write_text(POD_MOUNTINFO)
    target = tmp_path / "published"
    with pytest.raises(UsageError, match=rf"^publish_uri '{target}' is on this pod's own disk \(no volume"):
        steps.publish_model(str(tmp_path / "model"), {"accuracy": 0.9}, str(target))
    assert not target.exists()
