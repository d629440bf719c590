"""The deploy step against the Kubernetes API stand-in, driven by the real `kubernetes` client over HTTP.

A thread plays KServe's controller: when it sees a generation it has not observed, it reports the rollout in
progress, then Ready or failed, with statuses checked against KServe's own model types (the `kserve` SDK), as is
every InferenceService the step writes.
"""

import base64
import threading
import time

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from tests import kserve_schema
from tests.standins.kube import Call, KubeStandIn
from tests.support.paths import ROOT
from trainer import steps
from trainer.core.entry import run_step
from trainer.core.errors import KubernetesError, UsageError
from trainer.k8s import objects
from trainer.serving import kserve

NS = "kubeflow-user-example-com"
NAME = "mnist"
RESOURCE = f"{kserve_schema.PLURAL}.{kserve_schema.GROUP}"
URL = f"http://{NAME}.{NS}.example.com"
PUBLISH_URI = "gs://models-bucket/mnist"
LOAD_ERROR = (
    "Loading servable: {name: mnist version: 1796222222} failed: NOT_FOUND: Op type not registered "
    "'DisableCopyOnRead' in binary running on mnist-predictor-00002-deployment"
)


def _status(generation, ready, latest, serving=None, reason="", message="", failure=None):
    """An InferenceService status as KServe's controller writes it (Serverless mode), checked against its types."""
    conditions = [
        {"type": kind, "status": ready, **({"reason": reason, "message": message} if reason else {})}
        for kind in ("LatestDeploymentReady", "PredictorReady", "Ready")
    ]
    status = {"observedGeneration": generation, "conditions": conditions}
    predictor = {"latestCreatedRevision": latest}
    if serving:
        predictor.update(latestReadyRevision=serving, latestRolledoutRevision=serving, url=URL)
        status["url"] = URL
    status["components"] = {"predictor": predictor}
    status["modelStatus"] = {"transitionStatus": "BlockedByFailedLoad" if failure else "UpToDate"}
    if failure:
        status["modelStatus"]["lastFailureInfo"] = {"reason": "ModelLoadFailed", "message": failure, "exitCode": 1}
    assert kserve_schema.problems(status, "V1beta1InferenceServiceStatus", ".status") == []
    return status


def _revision(n):
    return f"{NAME}-predictor-{n:05d}"


class Controller(threading.Thread):
    """For each new generation: in progress for `delay` seconds, then `outcome` ("ready", "failed" or "stuck")."""

    def __init__(self, standin, outcome="ready", delay=0.4):
        super().__init__(daemon=True)
        self.standin, self.outcome, self.delay = standin, outcome, delay
        self.observed = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.05):
            obj = self.standin.get(RESOURCE, NS, NAME)
            if not obj or obj["metadata"]["generation"] <= self.observed:
                continue
            gen = self.observed = obj["metadata"]["generation"]
            serving = obj.get("status", {}).get("components", {}).get("predictor", {}).get("latestReadyRevision")
            waiting = 'Configuration "mnist-predictor" is waiting for a Revision to become ready.'
            unknown = _status(gen, "Unknown", _revision(gen), serving, "RevisionMissing", waiting)
            self.standin.set_status(RESOURCE, NS, NAME, unknown)
            if self.stop.wait(self.delay) or self.outcome == "stuck":
                continue
            if self.outcome == "ready":
                self.standin.set_status(RESOURCE, NS, NAME, _status(gen, "True", _revision(gen), _revision(gen)))
            else:
                message = f'Revision "{_revision(gen)}" failed with message: {LOAD_ERROR}.'
                failed = _status(gen, "False", _revision(gen), serving, "RevisionFailed", message, LOAD_ERROR)
                self.standin.set_status(RESOURCE, NS, NAME, failed)


@pytest.fixture
def cluster(httpserver, monkeypatch):
    """The API stand-in (optionally under a Role), a CustomObjectsApi on it, and a KServe controller thread."""
    monkeypatch.setenv("POD_NAMESPACE", NS)
    started = []

    def make(outcome="ready", role=None, delay=0.4):
        standin = KubeStandIn(role=role)
        standin.install(httpserver)
        api = client.CustomObjectsApi(objects.core_api(host=httpserver.url_for("").rstrip("/")).api_client)
        controller = Controller(standin, outcome, delay)
        controller.start()
        started.append(controller)
        return standin, api

    yield make
    for controller in started:
        controller.stop.set()
        controller.join(5)


def _deploy(api, version=1796222222, timeout=20, **changes):
    settings = {"serving_name": NAME, "serving_timeout": timeout, "serving_runtime_version": "2.20.0", **changes}
    path = f"{PUBLISH_URI}/{version}"
    return steps.deploy_model(PUBLISH_URI, version=version, published_path=path, api=api, poll=0.1, **settings)


def _existing(standin, runtime_version="2.6.2"):
    """An InferenceService someone created before, serving revision 1, with a field the step does not own."""
    body = kserve.manifest(NAME, PUBLISH_URI, runtime_version, 1796000000, f"{PUBLISH_URI}/1796000000")
    body["spec"]["predictor"]["minReplicas"] = 2
    standin.add(RESOURCE, NS, body)
    standin.set_status(RESOURCE, NS, NAME, _status(1, "True", _revision(1), _revision(1)))


def test_the_body_is_checked_against_kserves_types_and_the_check_can_fail():
    body = kserve.manifest(NAME, PUBLISH_URI, "2.20.0", 1, f"{PUBLISH_URI}/1")
    assert kserve_schema.inference_service_problems(body) == []
    model = body["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    model["runtimeVersion"] = 2.2
    del model["modelFormat"]
    found = " | ".join(kserve_schema.inference_service_problems(body))
    assert ".spec.predictor.model.storageURI: not a field of V1beta1ModelSpec" in found
    assert ".spec.predictor.model.runtimeVersion: 2.2 is not str" in found
    assert "model_format`, must not be `None`" in found


def test_create_waits_until_ready_and_reports_the_url(cluster):
    standin, api = cluster("ready")
    result = _deploy(api)
    assert result == kserve.Deployment(
        deployed=True,
        reason=f"InferenceService {NAME} serves version 1796222222 at {URL}",
        name=NAME,
        namespace=NS,
        url=URL,
        predict_url=f"{URL}/v1/models/{NAME}:predict",
        version=1796222222,
        created=True,
        generation=1,
        revision=_revision(1),
        service_account="",
    )
    stored = standin.get(RESOURCE, NS, NAME)
    assert kserve_schema.inference_service_problems(stored) == []
    model = stored["spec"]["predictor"]["model"]
    assert model == {
        "modelFormat": {"name": "tensorflow", "version": "2"},
        "protocolVersion": "v1",
        "runtimeVersion": "2.20.0",
        "storageUri": PUBLISH_URI,
    }
    assert stored["spec"]["predictor"]["annotations"] == {kserve.MODEL_VERSION_ANNOTATION: "1796222222"}
    assert [c.verb for c in standin.calls[:2]] == ["get", "create"]
    assert {c.verb for c in standin.calls[2:]} == {"get"}, "it only reads while it waits; it never deletes"


def test_patch_owns_its_fields_and_ignores_the_previous_generations_ready(cluster):
    standin, api = cluster("ready", delay=1.0)
    _existing(standin)
    started = time.monotonic()
    result = _deploy(api)
    assert time.monotonic() - started >= 1.0, "Ready of generation 1 described the old revision"
    assert not result.created and result.generation == 2 and result.revision == _revision(2)
    stored = standin.get(RESOURCE, NS, NAME)
    assert kserve_schema.inference_service_problems(stored) == []
    predictor = stored["spec"]["predictor"]
    assert predictor["minReplicas"] == 2, "a merge patch leaves what the step does not own"
    assert predictor["model"]["runtimeVersion"] == "2.20.0"
    assert predictor["annotations"][kserve.MODEL_VERSION_ANNOTATION] == "1796222222"
    assert [c.verb for c in standin.calls[:2]] == ["get", "patch"]
    again = _deploy(api)
    assert again.generation == 2, "the same version again changes nothing, so no new revision"


def test_a_failed_rollout_keeps_the_old_revision_serving_and_fails_the_step_with_kserves_reason(cluster, capsys):
    standin, api = cluster("failed")
    _existing(standin)
    with pytest.raises(SystemExit) as exit_info:
        run_step(_deploy, api=api)
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert f"InferenceService '{NAME}' in namespace '{NS}': the new revision failed: " in errors[0]
    assert (
        f'LatestDeploymentReady/PredictorReady/Ready False (RevisionFailed: Revision "{_revision(2)}" failed '
        f"with message: {LOAD_ERROR}.); model BlockedByFailedLoad: ModelLoadFailed: {LOAD_ERROR}; " in errors[0]
    )
    assert errors[0].endswith(f"revision {_revision(1)} keeps serving at {URL}")
    stored = standin.get(RESOURCE, NS, NAME)
    assert stored["status"]["components"]["predictor"]["latestRolledoutRevision"] == _revision(1)
    assert {c.verb for c in standin.calls} == {"get", "patch"}, "nothing rolled back or deleted"


def test_a_rollout_that_never_settles_fails_at_the_timeout_with_kserves_last_words(cluster):
    _, api = cluster("stuck")
    started = time.monotonic()
    with pytest.raises(kserve.RolloutFailed) as err:
        _deploy(api, timeout=1.5)
    assert 1.5 <= time.monotonic() - started < 60, "it waits the whole timeout, and no longer than a poll after it"
    message = str(err.value)
    assert f"InferenceService '{NAME}' in namespace '{NS}' is not Ready within 1.5s: " in message
    assert 'PredictorReady/Ready Unknown (RevisionMissing: Configuration "mnist-predictor" is waiting' in message
    assert message.endswith("no previous revision was serving")


def test_without_permission_the_error_names_the_grant(cluster):
    role = {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    _, api = cluster(role=role)
    with pytest.raises(KubernetesError, match=rf"forbidden: .* may not get {RESOURCE} in namespace '{NS}'"):
        _deploy(api)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"serving_name": "MNIST_v2"}, "serving_name 'MNIST_v2' is not allowed; allowed: empty, or lowercase"),
        ({"serving_timeout": 0}, "serving_timeout 0.0 is not allowed; allowed: a number from 1 to 86400"),
        ({"serving_runtime_version": "2.20.0 gpu"}, "serving_runtime_version '2.20.0 gpu' is not allowed"),
        ({"version": 0}, "nothing is published at publish_uri"),
    ],
)
def test_bad_settings_send_nothing(cluster, changes, message):
    standin, api = cluster()
    with pytest.raises(UsageError, match=message):
        _deploy(api, **changes)
    assert standin.calls == []


def test_a_publish_location_kserve_cannot_read_is_refused(cluster):
    standin, api = cluster()
    with pytest.raises(UsageError, match=r"publish_uri '/tmp/published' is not a location KServe's storage"):
        steps.deploy_model("/tmp/published", NAME, 60, "2.20.0", 1, "/tmp/published/1", api=api)
    skipped = steps.deploy_model(PUBLISH_URI, "", 60, "2.20.0", 1, "", api=api)
    assert skipped == kserve.Deployment(False, "not deployed: serving_name is empty")
    assert standin.calls == []


def test_an_s3_location_gives_the_storage_initializer_the_steps_keys_and_the_endpoint(cluster, monkeypatch):
    """KFP's SeaweedFS: a KServe-style Secret (s3-* annotations) on the predictor's service account, owned by it."""
    from tests.support.kubernetes import K8S_VERSION

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ns-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ns-secret")
    standin, api = cluster("ready")
    published = "s3://mlpipeline/private/{namespace}/models/mnist"
    result = steps.deploy_model(
        published,
        NAME,
        20,
        "2.20.0",
        7,
        f"s3://mlpipeline/private/{NS}/models/mnist/7",
        storage="kfp",
        api=api,
        poll=0.1,
    )
    assert result.deployed and result.service_account == f"{NAME}-storage"
    stored = standin.get(RESOURCE, NS, NAME)
    assert kserve_schema.inference_service_problems(stored) == []
    predictor = stored["spec"]["predictor"]
    assert predictor["serviceAccountName"] == f"{NAME}-storage"
    assert predictor["model"]["storageUri"] == f"s3://mlpipeline/private/{NS}/models/mnist", "the namespace is read"
    secret = standin.get("secrets", NS, f"{NAME}-storage")
    assert secret["metadata"]["annotations"] == {
        "serving.kserve.io/s3-endpoint": "seaweedfs.kubeflow:9000",
        "serving.kserve.io/s3-usehttps": "0",
        "serving.kserve.io/s3-region": "us-east-1",
    }
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "AWS_ACCESS_KEY_ID": "ns-key",
        "AWS_SECRET_ACCESS_KEY": "ns-secret",
    }, "the keys KServe's s3AccessKeyIDName / s3SecretAccessKeyName name by default"
    account = standin.get("serviceaccounts", NS, f"{NAME}-storage")
    assert account["secrets"] == [{"name": f"{NAME}-storage"}]
    for obj in (secret, account):
        owners = obj["metadata"]["ownerReferences"]
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
            ("InferenceService", NAME, stored["metadata"]["uid"])
        ]
        kubernetes_validate.validate(
            {k: v for k, v in obj.items() if k != "status"}
            | {
                "metadata": {
                    k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")
                }
            },
            K8S_VERSION,
            strict=True,
        )
    again = steps.deploy_model(
        published,
        NAME,
        20,
        "2.20.0",
        8,
        f"s3://mlpipeline/private/{NS}/models/mnist/8",
        storage="kfp",
        api=api,
        poll=0.1,
    )
    assert again.deployed and standin.get("secrets", NS, f"{NAME}-storage")["data"] == secret["data"]


def test_without_both_keys_the_predictor_keeps_its_own_service_account(cluster, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    standin, api = cluster("ready")
    result = steps.deploy_model("s3://models/m", NAME, 20, "2.20.0", 7, "s3://models/m/7", api=api, poll=0.1)
    assert result.deployed and result.service_account == ""
    assert "serviceAccountName" not in standin.get(RESOURCE, NS, NAME)["spec"]["predictor"]
    assert standin.get("secrets", NS, f"{NAME}-storage") is None, "an AWS role (IRSA) or the default account's"


@pytest.mark.parametrize("path", sorted(ROOT.joinpath("deploy").glob("rbac-*.yaml")), ids=lambda p: p.name)
def test_the_rbac_roles_grant_exactly_what_the_deploy_step_calls(cluster, path, monkeypatch):
    """A create, then a patch of a new version, of an InferenceService on S3, under the shipped Role."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    role = next(d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "Role")
    standin, api = cluster("ready", role=role, delay=0.1)
    for version in (1, 2):
        steps.deploy_model(
            "s3://models/m",
            NAME,
            20,
            "2.20.0",
            version,
            f"s3://models/m/{version}",
            s3_endpoint="http://s3:9000",
            api=api,
            poll=0.1,
        )
    assert Call("patch", RESOURCE, NS, NAME) in standin.calls
    used = {(call.resource, call.verb) for call in standin.calls}
    deploy_resources = {RESOURCE, "secrets", "serviceaccounts"}
    granted = {
        (f"{r}.{g}" if g else r, v)
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        if (f"{r}.{g}" if g else r) in deploy_resources
    }
    assert used == granted, path.name


def test_the_component_writes_the_deployment_record_to_its_outputs(cluster, httpserver, tmp_path, monkeypatch):
    """The deploy_model component body (no KFP runner): the API through KUBECONFIG, as in a pod, on the stand-in."""
    from kfp.dsl import Markdown

    import components
    from tests.standins.kube import write_kubeconfig

    cluster("ready", delay=0.1)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", httpserver.url_for("").rstrip("/"), NS)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kserve, "POLL_SECONDS", 0.1)
    decision = Markdown(uri=str(tmp_path / "decision.md"))
    decision.metadata.update(latest_version=7, latest_path=f"{PUBLISH_URI}/7")
    deployment = Markdown(uri=str(tmp_path / "deploy" / "deployment.md"))
    body = components.build("registry.example.com/team/kfp-tf-multiworker:9.9.9").deploy_model.python_func
    url = body(
        decision=decision,
        deployment=deployment,
        publish_uri=PUBLISH_URI,
        serving_name=NAME,
        serving_timeout=20.0,
        serving_runtime_version="2.20.0",
        storage="",
        s3_endpoint="",
    )
    assert url == URL
    assert deployment.metadata == {"name": NAME, "namespace": NS, "url": URL, "version": 7, "revision": _revision(1)}
    assert (tmp_path / "deploy" / "deployment.md").read_text() == (
        f"# Deploy\n\nInferenceService {NAME} serves version 7 at {URL}.\n\n"
        f'Predict: `POST {URL}/v1/models/{NAME}:predict` with `{{"instances": [...]}}` (raw uint8 images).\n'
    )
