"""Compile-time storage settings: the object store's credentials for the steps that store, and the checkpoint volume.

Both become Kubernetes platform settings in the compiled YAML (`kfp.kubernetes`); kfp.local ignores them.
`--storage kfp` is Kubeflow Pipelines' own object store (`trainer.storage.kfpstore`: SeaweedFS, the namespace's keys
in the Secret `mlpipeline-minio-artifact`); `--storage-secret` names any other Secret (docs/storage.md).
"""

import dataclasses
import re
from typing import Any

from kfp import kubernetes

from trainer.config import settings
from trainer.core.errors import UsageError
from trainer.k8s.checkpoints import MOUNT
from trainer.storage import kfpstore

KFP_KEYS = ",".join(f"{key}={env}" for key, env in kfpstore.SECRET_KEYS.items())
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class StorageSettings:
    """Compile-time storage settings of the pipeline.

    Attributes:
        storage: 'kfp': the pipeline's own object store (KFP 2.16+: SeaweedFS, the namespace's keys from the Secret
            mlpipeline-minio-artifact), which becomes the default of the storage parameter, with publish_uri
            s3://mlpipeline/private/{namespace}/models/mnist; empty: storage_secret, if any.
        storage_secret: another Secret in the run's namespace whose keys become the environment of the steps that
            store (publish, deploy, the parameter-server tasks); empty: none (GCS workload identity, AWS IRSA).
        storage_secret_keys: KEY=ENV pairs, comma-separated: which Secret key becomes which variable.
        checkpoint_volume: a ReadWriteMany PersistentVolumeClaim mounted at /mnt/checkpoints on every training
            worker, for checkpoints that outlive every pod; it is the default of the checkpoint_claim parameter, so a
            run can name another claim; empty: no volume.
        cache_data: whether KFP may reuse the data an earlier run prepared from the same source (the prepare step's
            cache); off for data that changes behind the same source (your function, an IDX location that is
            rewritten), so that every run reads it again.
    """

    storage: str = ""
    storage_secret: str = ""
    storage_secret_keys: str = KFP_KEYS
    checkpoint_volume: str = ""
    cache_data: bool = True

    def __post_init__(self) -> None:
        settings.check("storage", self.storage)
        if self.storage == kfpstore.KFP and self.storage_secret not in ("", kfpstore.SECRET):
            raise UsageError(
                f"storage_secret {self.storage_secret!r} is not allowed with storage 'kfp', which uses the Secret "
                f"{kfpstore.SECRET}; allowed: one of the two"
            )
        if self.storage_secret and not _NAME.match(self.storage_secret):
            raise UsageError(
                f"storage_secret {self.storage_secret!r} is not allowed; allowed: a Secret name (lowercase "
                "letters, digits, '-' and '.'), e.g. my-s3-credentials"
            )
        self.key_to_env()
        if self.checkpoint_volume:
            settings.check("checkpoint_claim", self.checkpoint_volume)

    @property
    def secret(self) -> str:
        """The Secret the storing steps get as environment: KFP's with storage 'kfp', else storage_secret."""
        return kfpstore.SECRET if self.storage == kfpstore.KFP else self.storage_secret

    def overrides(self, streams_data: bool = False) -> dict[str, Any]:
        """The pipeline parameter defaults these settings change.

        Args:
            streams_data: the pipeline's workers can read their shards from KFP's store (multi_worker_mirrored; the
                parameter-server workers read through TensorFlow's own file systems, which have no s3://): with
                storage 'kfp', data_uri defaults to the namespace's `private-artifacts/` there.
        """
        changed: dict[str, Any] = {}
        if self.storage == kfpstore.KFP:
            changed.update(storage=kfpstore.KFP, publish_uri=kfpstore.PUBLISH_URI)
            if streams_data:
                changed["data_uri"] = kfpstore.DATA_URI
        if self.checkpoint_volume:
            changed["checkpoint_claim"] = self.checkpoint_volume
        return changed

    def key_to_env(self) -> dict[str, str]:
        """`storage_secret_keys` as {secret key: environment variable}, checked."""
        if self.storage == kfpstore.KFP:
            return dict(kfpstore.SECRET_KEYS)
        pairs = [p.strip().partition("=") for p in self.storage_secret_keys.split(",") if p.strip()]
        if not pairs or any(not sep or not _KEY.match(k) or not _ENV.match(v) for k, sep, v in pairs):
            raise UsageError(
                f"storage_secret_keys {self.storage_secret_keys!r} is not allowed; allowed: KEY=ENV pairs, "
                f"comma-separated, e.g. {KFP_KEYS}"
            )
        return {k: v for k, _, v in pairs}


def with_storage_secret(task: Any, storage: StorageSettings) -> Any:
    """The Secret's keys as the task's environment (the credentials s3fs and botocore read), when one is named."""
    if storage.secret:
        kubernetes.use_secret_as_env(task, secret_name=storage.secret, secret_key_to_env=storage.key_to_env())
    return task


def with_checkpoint_volume(task: Any, claim: Any, storage: StorageSettings) -> Any:
    """Mounts the claim named by the pipeline parameter `claim` at /mnt/checkpoints, when compiled with a volume."""
    if storage.checkpoint_volume:
        kubernetes.mount_pvc(task, pvc_name=claim, mount_path=MOUNT)
    return task
