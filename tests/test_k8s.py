"""Peer discovery on Kubernetes: the real `kubernetes` client over real HTTP against a local stand-in."""

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.standins.kube import KubeStandIn
from trainer import k8s
from trainer.errors import KubernetesError, PeerUnavailableError, UsageError

RUN_ID = "0b6f5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
K8S_VERSION = "1.30.0"


@pytest.fixture
def standin(httpserver):
    fake = KubeStandIn(forbidden_namespaces={"locked"})
    fake.install(httpserver)
    return fake


@pytest.fixture
def api(httpserver):
    return k8s.core_api(host=httpserver.url_for("").rstrip("/"), token="test-token")


def test_names_are_short_dns_labels_unique_per_run():
    name = k8s.service_name(RUN_ID, 2)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 63
    assert name == k8s.service_name(RUN_ID, 2), "stable across retries"
    assert k8s.service_name("another-run", 2) != name
    assert k8s.worker_addresses(RUN_ID, 2, "team-a", 2222) == [
        f"{k8s.service_name(RUN_ID, 0)}.team-a.svc:2222", f"{k8s.service_name(RUN_ID, 1)}.team-a.svc:2222"]


def test_create_services_sends_headless_services_selecting_each_worker(standin, api, httpserver):
    addresses = k8s.create_services(api, "team-a", RUN_ID, 3, 2222)
    services = standin.items("services")
    assert len(services) == 3
    for index in range(3):
        body = services[("team-a", k8s.service_name(RUN_ID, index))]
        assert body["spec"]["clusterIP"] == "None"
        assert body["spec"]["publishNotReadyAddresses"] is True
        assert body["spec"]["selector"] == {"app.kubernetes.io/name": "kfp-tf-multiworker",
                                            "tf-multiworker.kubeflow.org/run": k8s.run_key(RUN_ID),
                                            "tf-multiworker.kubeflow.org/worker-index": str(index)}
        assert body["spec"]["ports"] == [{"name": "tf-grpc", "port": 2222, "targetPort": 2222, "protocol": "TCP"}]
        labels = body["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kfp-tf-multiworker"
        assert labels["app.kubernetes.io/managed-by"] == "kubeflow-pipelines"
        assert labels["pipelines.kubeflow.org/run-id"] == RUN_ID
        assert addresses[index] == f"{body['metadata']['name']}.team-a.svc:2222"
    request, _ = httpserver.log[0]
    assert request.headers["Authorization"] == "Bearer test-token"
    assert request.path == "/api/v1/namespaces/team-a/services"


def test_a_retried_create_keeps_the_existing_services(standin, api):
    first = k8s.create_services(api, "team-a", RUN_ID, 2)
    second = k8s.create_services(api, "team-a", RUN_ID, 2)
    assert first == second and len(standin.items("services")) == 2
    assert [c.verb for c in standin.calls] == ["create"] * 4


def test_pod_label_matches_its_service_selector(standin, api):
    k8s.create_services(api, "team-a", RUN_ID, 2)
    k8s.label_own_pod(api, "team-a", "mnist-xyz-train-worker-123", RUN_ID, 1)
    labels = standin.get("pods", "team-a", "mnist-xyz-train-worker-123")["metadata"]["labels"]
    services = standin.items("services")
    selector = services[("team-a", k8s.service_name(RUN_ID, 1))]["spec"]["selector"]
    assert selector.items() <= labels.items()
    other = services[("team-a", k8s.service_name(RUN_ID, 0))]["spec"]["selector"]
    assert not other.items() <= labels.items()


def test_delete_removes_only_this_runs_services_and_twice_is_fine(standin, api):
    k8s.create_services(api, "team-a", RUN_ID, 2)
    k8s.create_services(api, "team-a", "other-run", 1)
    assert sorted(k8s.delete_services(api, "team-a", RUN_ID)) == [k8s.service_name(RUN_ID, 0), k8s.service_name(RUN_ID, 1)]
    assert list(standin.items("services")) == [("team-a", k8s.service_name("other-run", 0))]
    assert k8s.delete_services(api, "team-a", RUN_ID) == []


def test_forbidden_names_verb_resource_and_namespace(standin, api):
    with pytest.raises(KubernetesError, match=r"may not create services in namespace 'locked'"):
        k8s.create_services(api, "locked", RUN_ID, 2)
    with pytest.raises(KubernetesError, match=r"may not patch pods in namespace 'locked'"):
        k8s.label_own_pod(api, "locked", "pod-1", RUN_ID, 0)
    with pytest.raises(KubernetesError, match=r"may not list services in namespace 'locked'"):
        k8s.delete_services(api, "locked", RUN_ID)


def test_rbac_role_grants_exactly_what_the_code_calls(standin, api):
    k8s.create_services(api, "team-a", RUN_ID, 2)
    k8s.create_services(api, "team-a", RUN_ID, 2)
    k8s.label_own_pod(api, "team-a", "pod-0", RUN_ID, 0)
    k8s.delete_services(api, "team-a", RUN_ID)
    used = {(call.resource, call.verb) for call in standin.calls}
    for path in sorted((ROOT / "deploy").glob("rbac-*.yaml")):
        role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
        granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
        assert granted == used, path.name


@pytest.mark.parametrize("path", sorted((ROOT / "deploy").glob("*.yaml")), ids=lambda p: p.name)
def test_deploy_manifests_validate_against_kubernetes_schemas(path):
    docs = [d for d in yaml.safe_load_all(path.read_text().replace("NAMESPACE", "kubeflow-user-example-com")) if d]
    assert {d["kind"] for d in docs} == {"Role", "RoleBinding"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"][0]["name"] in {"default-editor", "pipeline-runner"}


def test_service_bodies_validate_against_kubernetes_schemas():
    for index in range(3):
        kubernetes_validate.validate(k8s.service_manifest(RUN_ID, index, 2222), K8S_VERSION, strict=True)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: k8s.worker_addresses(RUN_ID, 0, "ns"), "num_workers 0 is not allowed; allowed: 1 to 64"),
    (lambda: k8s.worker_addresses(RUN_ID, 65, "ns"), "num_workers 65 is not allowed"),
    (lambda: k8s.worker_addresses(RUN_ID, 2, "ns", 70000), "port 70000 is not allowed; allowed: an integer from 1 to 65535"),
    (lambda: k8s.service_name("", 0), "run id is empty"),
])
def test_bad_inputs(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def test_waiting_for_peers_names_the_ones_that_never_resolve():
    k8s.wait_for_names(["localhost:2222"], timeout=1)
    with pytest.raises(PeerUnavailableError, match=r"did not resolve within 1s: tfw-r0-1\.nowhere\.invalid:2222"):
        k8s.wait_for_names(["localhost:2222", "tfw-r0-1.nowhere.invalid:2222"], timeout=1, interval=0.2)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("k8s") / "p.yaml"
    result = subprocess.run([sys.executable, "pipelines/mnist.py", "--compile", "--output", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    pipeline, platform_spec = list(yaml.safe_load_all(Path(out).read_text()))
    return pipeline, platform_spec["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_compiled_worker_has_downward_api_env_istio_annotation_resources_retry_timeout(platform):
    pipeline, executors = platform
    worker = executors["exec-train-worker"]
    assert {(e["name"], e["fieldPath"]) for e in worker["fieldPathAsEnv"]} == {("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")}
    assert worker["podMetadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert worker["activeDeadlineSeconds"] == "21600" or worker["activeDeadlineSeconds"] == 21600
    resources = pipeline["deploymentSpec"]["executors"]["exec-train-worker"]["container"]["resources"]
    assert resources["cpuRequest"] == 1.0 and resources["cpuLimit"] == 2.0 and resources["memoryLimit"] > resources["memoryRequest"]
    loop = next(c for c in pipeline["components"].values() if "dag" in c and "train-worker" in c["dag"]["tasks"])
    assert loop["dag"]["tasks"]["train-worker"]["retryPolicy"]["maxRetryCount"] == 2
    for name in ("exec-create-cluster", "exec-delete-cluster"):
        assert executors[name]["fieldPathAsEnv"] == [{"name": "POD_NAMESPACE", "fieldPath": "metadata.namespace"}]


def test_exit_handler_deletes_the_services(platform):
    pipeline, _ = platform
    tasks = pipeline["root"]["dag"]["tasks"]
    cleanup = tasks["delete-cluster"]
    assert cleanup["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert cleanup["dependentTasks"] == ["exit-handler-1"]
    run_id = cleanup["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"]
    assert run_id == "{{$.pipeline_job_uuid}}"
    inner = pipeline["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert inner["create-cluster"]["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"] == run_id
