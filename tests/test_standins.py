"""The stand-ins, driven by the real clients over real sockets on loopback: the `kubernetes` client with its own
in-cluster config loader over HTTPS, dnslib queries over UDP and TCP, and the project's `trainer.k8s.objects` calls.
"""

import json
from types import SimpleNamespace

import pytest
import urllib3
from dnslib import RCODE
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.config.incluster_config import InClusterConfigLoader

from tests.standins.dns import DnsServer, query
from tests.standins.incluster import make_incluster
from tests.standins.kube import Call, KubeStandIn
from trainer.k8s import objects

RUN_ID = "0b6f5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
NS = "team-a"
SVC0, SVC1 = objects.service_name(RUN_ID, 0), objects.service_name(RUN_ID, 1)
UNSCHEDULABLE = "0/3 nodes are available: 3 Insufficient cpu."


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_incluster(tmp_path_factory.mktemp("incluster"), host="127.0.0.1", namespace=NS)


@pytest.fixture
def cluster(files):
    """The API stand-in over HTTPS and the DNS stand-in, sharing one state, on ephemeral loopback ports."""
    standin = KubeStandIn(token=files.token, forbidden_namespaces={"locked"})
    with standin.serve_https("127.0.0.1", 0, files.server_cert, files.server_key) as api:
        with DnsServer(standin.dns_records, "127.0.0.1", 0) as dns:
            yield SimpleNamespace(standin=standin, api=api, dns=dns, port=api.port)


def _client(files, port: int) -> client.ApiClient:
    """An ApiClient configured by kubernetes' own in-cluster loader from the generated files."""
    configuration = client.Configuration()
    InClusterConfigLoader(
        token_filename=str(files.token_file), cert_filename=str(files.ca_file), environ=files.env(port)
    ).load_and_set(configuration)
    return client.ApiClient(configuration)


@pytest.fixture
def core(files, cluster):
    return client.CoreV1Api(_client(files, cluster.port))


def _error(excinfo) -> tuple[int, str, str]:
    body = json.loads(excinfo.value.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == excinfo.value.status
    return excinfo.value.status, body["reason"], body["message"]


def _ips(reply) -> list[str]:
    return [str(rr.rdata) for rr in reply.rr]


def test_incluster_files_configure_the_client_for_https_with_the_token(files, cluster):
    assert files.token_file.read_bytes() == files.token.encode(), "no trailing newline: the client sends it verbatim"
    assert (files.serviceaccount / "namespace").read_text() == NS
    configuration = _client(files, cluster.port).configuration
    assert configuration.host == f"https://127.0.0.1:{cluster.port}"
    assert configuration.api_key["authorization"] == f"bearer {files.token}"
    assert configuration.verify_ssl and configuration.ssl_ca_cert == str(files.ca_file)
    with pytest.raises(ValueError, match="without surrounding whitespace"):
        make_incluster(files.serviceaccount.parent / "bad", token="abc\n")


def test_incluster_client_creates_patches_lists_and_deletes(cluster, core):
    for index in range(2):
        created = core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, index))
        assert created.metadata.uid and created.metadata.resource_version and created.metadata.creation_timestamp
    with pytest.raises(ApiException) as err:
        core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, 0))
    assert _error(err) == (409, "AlreadyExists", f'services "{SVC0}" already exists')

    pod = core.patch_namespaced_pod("worker-0", NS, {"metadata": {"labels": objects.pod_labels(RUN_ID, 0)}})
    assert (pod.status.pod_ip, pod.status.phase) == ("127.0.0.1", "Running"), "the IP is learned from the caller"
    assert core.read_namespaced_pod("worker-0", NS).metadata.labels == objects.pod_labels(RUN_ID, 0)

    def names(**selectors) -> list[str]:
        return [s.metadata.name for s in core.list_namespaced_service(NS, **selectors).items]

    assert names(label_selector=objects.selector(RUN_ID)) == [SVC0, SVC1]
    assert names(label_selector=f"{objects.INDEX_LABEL} in (1,7)") == [SVC1]
    assert names(label_selector=f"{objects.INDEX_LABEL}!=1,app.kubernetes.io/name") == [SVC0]
    assert names(field_selector=f"metadata.name={SVC1}") == [SVC1]
    assert names(label_selector="app.kubernetes.io/name=other") == []

    core.delete_namespaced_service(SVC0, NS)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_service(SVC0, NS)
    assert _error(err) == (404, "NotFound", f'services "{SVC0}" not found')
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_service(SVC0, NS)
    assert err.value.status == 404
    assert cluster.standin.calls == [Call("create", "services", NS, None)] * 3 + [
        Call("patch", "pods", NS, "worker-0"),
        Call("get", "pods", NS, "worker-0"),
    ] + [Call("list", "services", NS, None)] * 5 + [
        Call("delete", "services", NS, SVC0),
        Call("get", "services", NS, SVC0),
        Call("delete", "services", NS, SVC0),
    ]


def test_a_wrong_token_gets_401_and_a_foreign_ca_fails_verification(files, cluster, tmp_path):
    wrong = tmp_path / "token"
    wrong.write_text("not-the-token")
    configuration = client.Configuration()
    InClusterConfigLoader(str(wrong), str(files.ca_file), environ=files.env(cluster.port)).load_and_set(configuration)
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(client.ApiClient(configuration)).list_namespaced_service(NS)
    assert _error(err) == (401, "Unauthorized", "Unauthorized")

    other = make_incluster(tmp_path / "other", host="127.0.0.1", token=files.token)
    configuration = other.configuration(cluster.port)
    configuration.retries = 0
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="CERTIFICATE_VERIFY_FAILED"):
        client.CoreV1Api(client.ApiClient(configuration)).list_namespaced_service(NS)
    assert cluster.standin.items("services") == {}


def test_forbidden_namespace_gets_the_api_servers_403(cluster, core):
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("pod-1", "locked", {"metadata": {"labels": {"a": "b"}}})
    assert _error(err) == (
        403,
        "Forbidden",
        'pods "pod-1" is forbidden: User "system:serviceaccount:'
        'kubeflow-user-example-com:default-editor" cannot patch resource "pods" in API group "" '
        'in the namespace "locked"',
    )
    assert cluster.standin.items("pods") == {}


def test_dns_follows_service_selectors_and_pod_labels(cluster, core):
    fqdn = f"{SVC0}.{NS}.svc.cluster.local"

    def ask(name: str, qtype: str = "A", tcp: bool = False):
        return query(name, "127.0.0.1", cluster.dns.port, qtype, tcp=tcp)

    core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, 0))
    core.patch_namespaced_pod("worker-0", NS, {"metadata": {"labels": {"app": "not-yet"}}})
    assert ask(fqdn).header.rcode == RCODE.NXDOMAIN, "the Service selects no pod yet"

    core.patch_namespaced_pod("worker-0", NS, {"metadata": {"labels": objects.pod_labels(RUN_ID, 0)}})
    reply = ask(fqdn)
    assert (reply.header.rcode, _ips(reply), reply.rr[0].ttl) == (RCODE.NOERROR, ["127.0.0.1"], 5)
    assert _ips(ask(fqdn.upper() + ".", tcp=True)) == ["127.0.0.1"], "TCP; case and trailing dot do not matter"
    aaaa = ask(fqdn, "AAAA")
    assert (aaaa.header.rcode, aaaa.rr) == (RCODE.NOERROR, []), "a known name has no AAAA, as with CoreDNS"
    assert ask(f"{SVC0}.{NS}.svc").header.rcode == RCODE.NXDOMAIN, "search paths are the client's job"
    assert ask("pypi.org").header.rcode == RCODE.NXDOMAIN, "never forwards"

    cluster.standin.add_pod(NS, "replacement", labels=objects.pod_labels(RUN_ID, 0), ip="127.0.0.3")
    assert _ips(ask(fqdn)) == ["127.0.0.1", "127.0.0.3"]
    cluster.standin.set_status("pods", NS, "worker-0", {"phase": "Failed"})
    assert _ips(ask(fqdn)) == ["127.0.0.3"], "a pod that has ended leaves its Service's endpoints"

    core.delete_namespaced_service(SVC0, NS)
    assert ask(fqdn).header.rcode == RCODE.NXDOMAIN


def test_pods_in_any_state_their_events_and_readiness(cluster, core):
    standin = cluster.standin
    standin.add_pod(
        NS,
        "worker-1",
        labels=objects.pod_labels(RUN_ID, 1),
        phase="Pending",
        conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": UNSCHEDULABLE}],
    )
    standin.add_event(NS, "worker-1", "FailedScheduling", UNSCHEDULABLE)
    standin.add_event(NS, "worker-0", "Scheduled", "Successfully assigned", "Normal")
    pod = core.read_namespaced_pod("worker-1", NS)
    assert (pod.status.phase, pod.status.pod_ip) == ("Pending", None)
    assert (pod.status.conditions[0].reason, pod.status.conditions[0].message) == ("Unschedulable", UNSCHEDULABLE)
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=worker-1").items
    assert [(e.reason, e.message, e.type) for e in events] == [("FailedScheduling", UNSCHEDULABLE, "Warning")]
    core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, 1))
    assert standin.dns_records() == {}, "a pending pod has no IP"

    standin.add_pod(NS, "not-ready", labels={"app": "x"}, ip="127.0.0.2", ready=False)
    for name, publish in (("published", True), ("strict", False)):
        core.create_namespaced_service(
            NS,
            {
                "metadata": {"name": name},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": publish, "selector": {"app": "x"}},
            },
        )
    assert standin.dns_records() == {f"published.{NS}.svc.cluster.local": ["127.0.0.2"]}
    patched = core.patch_namespaced_pod(
        "not-ready", NS, {"metadata": {"labels": {"extra": "1"}}, "status": {"podIP": "127.0.0.9"}}
    )
    assert patched.status.pod_ip == "127.0.0.2", "a pod keeps the IP it has; status is not patched through the pod"


def test_patch_kinds_replace_conflicts_and_deletecollection(files, cluster, core):
    owner = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "wf", "uid": "u-1"}
    core.patch_namespaced_pod("p", NS, {"metadata": {"ownerReferences": [owner], "labels": {"a": "1"}}})
    pod = core.patch_namespaced_pod("p", NS, {"metadata": {"ownerReferences": [{**owner, "uid": "u-2"}]}})
    assert [o.uid for o in pod.metadata.owner_references] == ["u-1", "u-2"], "strategic merge: merged by uid"
    pod = core.patch_namespaced_pod("p", NS, [{"op": "add", "path": "/metadata/labels/b", "value": "2"}])
    assert pod.metadata.labels == {"a": "1", "b": "2"}, "JSON patch"
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", NS, [{"op": "test", "path": "/metadata/labels/a", "value": "9"}])
    assert err.value.status == 422

    created = core.create_namespaced_service(NS, objects.service_manifest(RUN_ID, 0))
    body = {**objects.service_manifest(RUN_ID, 0)}
    body["metadata"] = {**body["metadata"], "resourceVersion": created.metadata.resource_version}
    replaced = core.replace_namespaced_service(SVC0, NS, body)
    assert replaced.metadata.uid == created.metadata.uid
    assert int(replaced.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_service(SVC0, NS, body)
    assert err.value.status == 409 and _error(err)[1] == "Conflict"

    core.create_namespaced_service(NS, objects.service_manifest("other-run", 0))
    core.delete_collection_namespaced_service(NS, label_selector=objects.selector(RUN_ID))
    assert list(cluster.standin.items("services")) == [(NS, objects.service_name("other-run", 0))]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_service(NS, label_selector="a in (x")
    assert err.value.status == 400


def test_custom_objects_round_trip_and_own_other_objects(files, cluster, core):
    api_client = _client(files, cluster.port)
    custom = client.CustomObjectsApi(api_client)
    where = ("argoproj.io", "v1alpha1", NS, "workflows")
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "run-1", "labels": {"a": "b"}},
        "spec": {"entrypoint": "main"},
    }
    created = custom.create_namespaced_custom_object(*where, workflow)
    assert custom.get_namespaced_custom_object(*where, "run-1") == created
    listed = custom.list_namespaced_custom_object(*where, label_selector="a=b")
    assert (listed["kind"], listed["apiVersion"]) == ("WorkflowList", "argoproj.io/v1alpha1")
    assert [item["metadata"]["uid"] for item in listed["items"]] == [created["metadata"]["uid"]]

    patched = custom.patch_namespaced_custom_object(*where, "run-1", {"metadata": {"annotations": {"x": "y"}}})
    assert (patched["metadata"]["labels"], patched["metadata"]["annotations"]) == ({"a": "b"}, {"x": "y"})
    with pytest.raises(ApiException) as err:  # custom resources take no strategic merge patch, as on a real server
        api_client.call_api(
            "/apis/argoproj.io/v1alpha1/namespaces/team-a/workflows/run-1",
            "PATCH",
            header_params={"Content-Type": "application/strategic-merge-patch+json"},
            body={"metadata": {}},
            auth_settings=["BearerToken"],
            response_type="object",
        )
    assert err.value.status == 415

    owner = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "name": "run-1",
        "uid": created["metadata"]["uid"],
        "controller": True,
    }
    service = {**objects.service_manifest(RUN_ID, 0)}
    service["metadata"] = {**service["metadata"], "ownerReferences": [owner]}
    assert core.create_namespaced_service(NS, service).metadata.owner_references[0].uid == owner["uid"]
    custom.delete_namespaced_custom_object(*where, "run-1")
    with pytest.raises(ApiException) as err:
        custom.get_namespaced_custom_object(*where, "run-1")
    assert _error(err) == (404, "NotFound", 'workflows.argoproj.io "run-1" not found')
    assert [call.verb for call in cluster.standin.calls if call.resource == "workflows.argoproj.io"] == [
        "create",
        "get",
        "list",
        "patch",
        "patch",
        "delete",
        "get",
    ]
