"""Kubeflow Pipelines' own object store, as KFP 2.16 and later install it: SeaweedFS behind an S3 API.

KFP keeps its artifacts in the bucket `mlpipeline` of the Service `seaweedfs` in `kubeflow` (S3 on port 8333, and on
9000 for compatibility: `backend/src/v2/objectstore/config.go` uses `seaweedfs.kubeflow:9000`). The keys are in the
Secret `mlpipeline-minio-artifact` (its old name; keys `accesskey` and `secretkey`). In multi-user mode the profile
controller gives each namespace its own keys, allowed to write only under the prefixes `PREFIXES` names
(`pipelines-profile-controller/sync.py`); a model therefore belongs under `private/<namespace>/` (the namespace's
own) or `shared/` (every namespace's). `private-artifacts/` may expire (`ARTIFACT_RETENTION_DAYS`).

`storage=kfp` means all of this: the endpoint, the Secret (compiled into the pods that need storage), a publish
location under `private/<namespace>/` and, for the multi_worker_mirrored pipeline, the prepared dataset's shards
under `private-artifacts/<namespace>/datasets/` (`DATA_URI`), the namespace read at run time (`{namespace}`).
"""

from __future__ import annotations

import dataclasses
import os

from trainer.config.contract import StorageConfig
from trainer.core.errors import UsageError

KFP = "kfp"
ENDPOINT = "http://seaweedfs.kubeflow:9000"
BUCKET = "mlpipeline"
SECRET = "mlpipeline-minio-artifact"
SECRET_KEYS = {"accesskey": "AWS_ACCESS_KEY_ID", "secretkey": "AWS_SECRET_ACCESS_KEY"}
NAMESPACE = "{namespace}"
PUBLISH_URI = f"s3://{BUCKET}/private/{NAMESPACE}/models/mnist"
# Prepared datasets: beside the namespace's KFP artifacts, under the same retention (ARTIFACT_RETENTION_DAYS).
DATA_URI = f"s3://{BUCKET}/private-artifacts/{NAMESPACE}/datasets"
PREFIXES = ("artifacts/", "private-artifacts/{namespace}/", "private/{namespace}/", "shared/")


def writable_prefixes(namespace: str) -> list[str]:
    """The locations a namespace's keys may write, as `s3://` URIs."""
    return [f"s3://{BUCKET}/{prefix.format(namespace=namespace)}" for prefix in PREFIXES]


def denied_hint(namespace: str) -> str:
    """What to add when KFP's store refuses a write: where this namespace's keys may write."""
    return (
        f"are the keys KFP gives namespace {namespace!r} (storage=kfp), which may read and write only under "
        f"{', '.join(writable_prefixes(namespace))}"
    )


def expand(uri: str, namespace: str | None) -> str:
    """`uri` with `{namespace}` replaced by the run's namespace.

    Raises:
        UsageError: `uri` names `{namespace}` and there is no namespace (not a pod of a run).
    """
    if NAMESPACE not in uri:
        return uri
    if not namespace:
        raise UsageError(
            f"location {uri!r} names {NAMESPACE}, which only a pod of a run knows (POD_NAMESPACE); allowed here: "
            "a location without it"
        )
    return uri.replace(NAMESPACE, namespace)


@dataclasses.dataclass(frozen=True)
class Store:
    """Where this run's s3:// locations live, and what to add when the store refuses a write (empty: nothing)."""

    endpoint: str
    refused: str = ""


def store(config: StorageConfig, namespace: str | None) -> Store:
    """The object store `config` names, for a process in `namespace` (None: not a pod).

    Raises:
        UsageError: `storage` is `kfp` but the pod has no keys (the pipeline was not compiled with --storage kfp).
    """
    if config.storage != KFP:
        return Store(config.s3_endpoint)
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        raise UsageError(
            f"storage 'kfp' needs the keys of the Secret {SECRET} as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; "
            "allowed: a pipeline compiled with --storage kfp (which gives them to the pods that store), or storage ''"
        )
    return Store(config.s3_endpoint or ENDPOINT, denied_hint(namespace or "<namespace>"))
