"""Serving the published model with KServe: create or patch an InferenceService and wait until it is Ready.

The InferenceService (`serving.kserve.io/v1beta1`) runs KServe's TensorFlow Serving runtime on the publish
location: `storageUri` is the published root, whose integer version directories TF Serving reads, and it serves the
highest. `runtimeVersion` pins the TF Serving image, because KServe's default (2.6.2) cannot load what TensorFlow
2.21 exports (docs/serving.md). The published version is written as an annotation of the predictor's pods, so a new
version makes a new revision even though the storageUri stays the same.

A new revision that fails (the image cannot be pulled, the model does not load) leaves the previous one serving:
KServe moves traffic only to a Ready revision. The step then fails with KServe's reason. Uses the `kubernetes`
client (in-cluster config in a pod); never deletes anything.

For an `s3://` location (KFP's SeaweedFS, MinIO, AWS) KServe's storage initializer needs the keys and the endpoint:
it reads them from a Secret listed by the predictor's service account, the endpoint in the Secret's
`serving.kserve.io/s3-*` annotations (`pkg/credentials/s3/s3_secret.go`). The step writes both from the keys it
was given itself (`s3_credentials`), owned by the InferenceService, so they go when it is deleted.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from trainer.core.errors import KubernetesError, UsageError

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL, KIND = "serving.kserve.io", "v1beta1", "inferenceservices", "InferenceService"
RESOURCE = f"{PLURAL}.{GROUP}"
MODEL_VERSION_ANNOTATION = "tf-multiworker.kubeflow.org/model-version"
PUBLISHED_ANNOTATION = "tf-multiworker.kubeflow.org/published-path"
STORAGE_SCHEMES = ("gs://", "s3://", "pvc://", "https://", "http://", "hdfs://", "webhdfs://")
POLL_SECONDS = 5.0
# KServe's failure states (ModelStatus.transitionStatus) and Knative's terminal reason for a revision that failed.
FAILED_TRANSITIONS = ("BlockedByFailedLoad", "InvalidSpec")
FAILED_REASONS = ("RevisionFailed", "RevisionMissing", "ContainerMissing")
READY_FAMILY = ("Ready", "PredictorReady", "LatestDeploymentReady", "PredictorConfigurationReady")
LABELS = {
    "app.kubernetes.io/name": "kfp-tf-multiworker",
    "app.kubernetes.io/component": "serving",
    "app.kubernetes.io/managed-by": "kubeflow-pipelines",
}
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_ANNOTATION = "serving.kserve.io/s3-"
DEFAULT_REGION = "us-east-1"


class RolloutFailed(KubernetesError):
    """KServe reported the new revision as failed; the previous one, if any, keeps serving."""


@dataclasses.dataclass(frozen=True)
class Deployment:
    """What the deploy step did: the record that becomes its outputs.

    Attributes:
        deployed: whether an InferenceService serves the model now.
        reason: one sentence saying what serves what where, or why nothing was deployed.
        name: the InferenceService's name (empty when not deployed; so are the rest).
        namespace: its namespace.
        url: KServe's URL of it.
        predict_url: TF Serving's REST predict endpoint behind it.
        version: the published version it serves.
        created: whether this step created it (else it patched it).
        generation: the InferenceService's generation this step waited for.
        revision: the predictor's latest ready revision.
        service_account: the predictor's service account with the storage keys (empty: the namespace's default).
    """

    deployed: bool
    reason: str
    name: str = ""
    namespace: str = ""
    url: str = ""
    predict_url: str = ""
    version: int = 0
    created: bool = False
    generation: int = 0
    revision: str = ""
    service_account: str = ""

    @classmethod
    def skipped(cls, reason: str) -> Deployment:
        """Nothing deployed, and why."""
        return cls(False, reason)

    def output_metadata(self) -> dict[str, Any]:
        """The deployment artifact's metadata: `name`, `namespace`, `url`, `version`, `revision`."""
        return {
            "name": self.name,
            "namespace": self.namespace,
            "url": self.url,
            "version": self.version,
            "revision": self.revision,
        }


def storage_uri(publish_uri: str) -> str:
    """The publish location as KServe's storageUri, refusing what a model server pod cannot read."""
    if not publish_uri:
        raise UsageError("publish_uri is empty; the InferenceService serves the publish location, so set both")
    if not publish_uri.startswith(STORAGE_SCHEMES):
        raise UsageError(
            f"publish_uri {publish_uri!r} is not a location KServe's storage initializer can read; allowed: a URI "
            f"starting with {', '.join(STORAGE_SCHEMES)} (a path inside the pipeline's pod is not visible to it)"
        )
    return publish_uri.rstrip("/")


def manifest(
    name: str, storage: str, runtime_version: str, version: int, published_path: str, service_account: str = ""
) -> dict[str, Any]:
    """The InferenceService: KServe's TF Serving runtime on the published root, pinned, tagged with the version.

    `service_account` is the predictor's (`s3_credentials`); empty: the namespace's default one.
    """
    predictor: dict[str, Any] = {
        "annotations": {MODEL_VERSION_ANNOTATION: str(version)},
        "model": {
            "modelFormat": {"name": "tensorflow", "version": "2"},
            "protocolVersion": "v1",
            "runtimeVersion": runtime_version,
            "storageUri": storage,
        },
    }
    if service_account:
        predictor["serviceAccountName"] = service_account
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name,
            "labels": dict(LABELS),
            "annotations": {MODEL_VERSION_ANNOTATION: str(version), PUBLISHED_ANNOTATION: published_path},
        },
        "spec": {"predictor": predictor},
    }


def s3_credentials(
    name: str, endpoint: str, keys: Mapping[str, str], region: str = DEFAULT_REGION
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Secret and the ServiceAccount that give KServe's storage initializer an S3 store's keys and endpoint.

    Args:
        name: the InferenceService's name; both are called `<name>-storage`.
        endpoint: the store's URL (`http://seaweedfs.kubeflow:9000`); empty: AWS S3.
        keys: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
        region: the store's region (SeaweedFS and MinIO take any).
    """
    annotations = {f"{S3_ANNOTATION}region": region}
    if endpoint:
        url = urlsplit(endpoint)
        annotations.update(
            {f"{S3_ANNOTATION}endpoint": url.netloc, f"{S3_ANNOTATION}usehttps": "1" if url.scheme == "https" else "0"}
        )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-storage", "labels": dict(LABELS), "annotations": annotations},
        "type": "Opaque",
        "data": {key: base64.b64encode(keys[key].encode()).decode() for key in S3_KEYS},
    }
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": f"{name}-storage", "labels": dict(LABELS)},
        "secrets": [{"name": f"{name}-storage"}],
    }
    return secret, account


def apply_credentials(core: Any, namespace: str, objects: tuple[dict[str, Any], dict[str, Any]]) -> str:
    """Creates the Secret and ServiceAccount of `s3_credentials`, or patches them into place; returns the account."""
    from kubernetes.client.exceptions import ApiException

    from trainer.k8s.objects import explain

    secret, account = objects
    calls = (
        ("secrets", secret, core.create_namespaced_secret, core.patch_namespaced_secret),
        ("serviceaccounts", account, core.create_namespaced_service_account, core.patch_namespaced_service_account),
    )
    for resource, body, create, patch in calls:
        try:
            create(namespace, body)
        except ApiException as err:
            if err.status != 409:
                raise explain(err, "create", resource, namespace) from None
            try:
                patch(body["metadata"]["name"], namespace, body)
            except ApiException as err:
                raise explain(err, "patch", resource, namespace) from None
    return account["metadata"]["name"]


def own_credentials(core: Any, namespace: str, account: str, service: dict[str, Any]) -> None:
    """Makes the InferenceService the owner of its credentials, so that deleting it deletes them."""
    from kubernetes.client.exceptions import ApiException

    from trainer.k8s.objects import explain

    owner = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": service["metadata"]["name"],
        "uid": service["metadata"]["uid"],
        "blockOwnerDeletion": False,
    }
    patch = {"metadata": {"ownerReferences": [owner]}}
    for resource, call in (
        ("secrets", core.patch_namespaced_secret),
        ("serviceaccounts", core.patch_namespaced_service_account),
    ):
        try:
            call(account, namespace, patch)
        except ApiException as err:
            raise explain(err, "patch", resource, namespace) from None


def apply(api: Any, namespace: str, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Creates the InferenceService, or merge-patches the fields this step owns into the one that exists.

    A merge patch leaves everything else (resources, replicas, a canary, the user's own annotations) as it is.

    Returns:
        The stored object and whether it was created.
    """
    from kubernetes.client.exceptions import ApiException

    name = body["metadata"]["name"]
    try:
        api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as err:
        if err.status != 404:
            raise _explain(err, "get", namespace) from None
        try:
            return api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body), True
        except ApiException as err:
            raise _explain(err, "create", namespace) from None
    patch = {"metadata": {k: body["metadata"][k] for k in ("labels", "annotations")}, "spec": body["spec"]}
    try:
        return api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, patch), False
    except ApiException as err:
        raise _explain(err, "patch", namespace) from None


def _explain(err: Any, verb: str, namespace: str) -> KubernetesError:
    from trainer.k8s.objects import explain

    if err.status == 404 and verb == "create":
        return KubernetesError(
            f"create {RESOURCE} in namespace {namespace!r} failed: HTTP 404: KServe is not installed on this "
            "cluster (no InferenceService resource), or the namespace does not exist"
        )
    return explain(err, verb, RESOURCE, namespace)


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def describe(status: dict[str, Any]) -> str:
    """KServe's own words for where a rollout stands: the not-Ready conditions and the model's failure info."""
    said: dict[str, list[str]] = {}  # Knative repeats one reason on several conditions: say it once
    for kind, c in _conditions(status).items():
        if kind in READY_FAMILY and c.get("status") != "True":
            why = ": ".join(filter(None, [c.get("reason"), (c.get("message") or "").strip()]))
            said.setdefault(f"{c.get('status')}" + (f" ({why})" if why else ""), []).append(kind)
    parts = [f"{'/'.join(kinds)} {what}" for what, kinds in said.items()]
    model = status.get("modelStatus") or {}
    failure = model.get("lastFailureInfo") or {}
    if failure:
        parts.append(
            f"model {model.get('transitionStatus', '')}: {failure.get('reason', '')}: {failure.get('message', '')}"
        )
    return "; ".join(parts) or "no conditions reported yet"


def _serving_now(status: dict[str, Any]) -> str:
    predictor = (status.get("components") or {}).get("predictor") or {}
    revision = predictor.get("latestRolledoutRevision") or predictor.get("latestReadyRevision")
    if not revision:
        return "no previous revision was serving"
    url = status.get("url") or predictor.get("url") or ""
    return f"revision {revision} keeps serving" + (f" at {url}" if url else "")


def failed(status: dict[str, Any]) -> bool:
    """Whether KServe reports the rollout as failed (not merely in progress)."""
    model = status.get("modelStatus") or {}
    if model.get("transitionStatus") in FAILED_TRANSITIONS:
        return True
    return any(
        c.get("status") == "False" and c.get("reason") in FAILED_REASONS
        for kind, c in _conditions(status).items()
        if kind in READY_FAMILY
    )


def wait_until_ready(
    api: Any, namespace: str, name: str, generation: int, timeout: float, poll: float = POLL_SECONDS
) -> dict[str, Any]:
    """Waits until KServe has observed `generation` and reports the InferenceService Ready.

    A Ready status of an earlier generation does not count: it describes the previous revision.

    Returns:
        The InferenceService's status.

    Raises:
        RolloutFailed: KServe reports the new revision as failed, or it is not Ready within `timeout` seconds; the
            message has KServe's reasons and says which revision keeps serving.
    """
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while True:
        try:
            status = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name).get("status") or {}
        except ApiException as err:
            raise _explain(err, "get", namespace) from None
        current = int(status.get("observedGeneration") or 0) >= generation
        if current and _conditions(status).get("Ready", {}).get("status") == "True":
            return status
        if current and failed(status):
            raise RolloutFailed(
                f"InferenceService {name!r} in namespace {namespace!r}: the new revision failed: "
                f"{describe(status)}; {_serving_now(status)}"
            )
        if time.monotonic() >= deadline:
            seen = "" if current else f" (KServe has not observed generation {generation} yet)"
            raise RolloutFailed(
                f"InferenceService {name!r} in namespace {namespace!r} is not Ready within {timeout:g}s{seen}: "
                f"{describe(status) if current else 'waiting'}; {_serving_now(status)}"
            )
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def deploy(
    api: Any,
    namespace: str,
    name: str,
    publish_uri: str,
    runtime_version: str,
    version: int,
    published_path: str,
    timeout: float,
    poll: float = POLL_SECONDS,
    credentials: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> Deployment:
    """Creates or patches the InferenceService for the published `version` and waits until it serves it.

    With `credentials` (`s3_credentials`), their Secret and ServiceAccount are written first, the predictor runs
    as that account, and the InferenceService owns both.

    Returns:
        The deployment: the InferenceService, its URLs, revision and service account.
    """
    from kubernetes import client

    location = storage_uri(publish_uri)
    core = client.CoreV1Api(api.api_client)
    account = apply_credentials(core, namespace, credentials) if credentials else ""
    body = manifest(name, location, runtime_version, version, published_path, account)
    stored, created = apply(api, namespace, body)
    if account:
        own_credentials(core, namespace, account, stored)
    generation = int(stored.get("metadata", {}).get("generation") or 1)
    log.info("%s InferenceService %s (generation %d)", "created" if created else "patched", name, generation)
    status = wait_until_ready(api, namespace, name, generation, timeout, poll)
    url = status.get("url") or ""
    predictor = (status.get("components") or {}).get("predictor") or {}
    return Deployment(
        deployed=True,
        reason=f"InferenceService {name} serves version {version} at {url}",
        name=name,
        namespace=namespace,
        url=url,
        predict_url=f"{url}/v1/models/{name}:predict" if url else "",
        version=version,
        created=created,
        generation=generation,
        revision=predictor.get("latestReadyRevision", ""),
        service_account=account,
    )
