"""Compile-time storage settings: the Secret that gives the publish step its S3 credentials, and the checkpoint volume.

Both become Kubernetes platform settings in the compiled YAML (`kfp.kubernetes`); kfp.local ignores them.
Standalone KFP keeps its MinIO credentials in the Secret `mlpipeline-minio-artifact` (keys `accesskey` and
`secretkey`), which is the default key mapping here; see docs/storage.md for AWS and GCS.
"""

import dataclasses
import re
from typing import Any

from kfp import kubernetes

from trainer import settings
from trainer.checkpoints import MOUNT
from trainer.errors import UsageError

MINIO_SECRET = "mlpipeline-minio-artifact"
MINIO_KEYS = "accesskey=AWS_ACCESS_KEY_ID,secretkey=AWS_SECRET_ACCESS_KEY"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class StorageSettings:
    """Compile-time storage settings of the pipeline.

    Attributes:
        storage_secret: a Secret in the run's namespace whose keys become the publish step's environment, e.g.
            mlpipeline-minio-artifact (standalone KFP's MinIO); empty: none (GCS workload identity, AWS IRSA).
        storage_secret_keys: KEY=ENV pairs, comma-separated: which Secret key becomes which variable.
        checkpoint_volume: a ReadWriteMany PersistentVolumeClaim mounted at /mnt/checkpoints on every training
            worker, for checkpoints that outlive a pod; it is the default of the checkpoint_claim parameter, so a
            run can name another claim; empty: no volume.
    """

    storage_secret: str = ""
    storage_secret_keys: str = MINIO_KEYS
    checkpoint_volume: str = ""

    def __post_init__(self) -> None:
        if self.storage_secret and not _NAME.match(self.storage_secret):
            raise UsageError(
                f"storage_secret {self.storage_secret!r} is not allowed; allowed: a Secret name (lowercase "
                "letters, digits, '-' and '.'), e.g. mlpipeline-minio-artifact"
            )
        self.key_to_env()
        if self.checkpoint_volume:
            settings.check("checkpoint_claim", self.checkpoint_volume)

    def overrides(self) -> dict[str, Any]:
        """The pipeline parameter defaults these settings change."""
        return {"checkpoint_claim": self.checkpoint_volume} if self.checkpoint_volume else {}

    def key_to_env(self) -> dict[str, str]:
        """`storage_secret_keys` as {secret key: environment variable}, checked."""
        pairs = [p.strip().partition("=") for p in self.storage_secret_keys.split(",") if p.strip()]
        if not pairs or any(not sep or not _KEY.match(k) or not _ENV.match(v) for k, sep, v in pairs):
            raise UsageError(
                f"storage_secret_keys {self.storage_secret_keys!r} is not allowed; allowed: KEY=ENV pairs, "
                f"comma-separated, e.g. {MINIO_KEYS}"
            )
        return {k: v for k, _, v in pairs}


def with_storage_secret(task: Any, settings: StorageSettings) -> Any:
    """The Secret's keys as the task's environment (the credentials s3fs and botocore read), when one is named."""
    if settings.storage_secret:
        kubernetes.use_secret_as_env(task, secret_name=settings.storage_secret, secret_key_to_env=settings.key_to_env())
    return task


def with_checkpoint_volume(task: Any, claim: Any, settings: StorageSettings) -> Any:
    """Mounts the claim named by the pipeline parameter `claim` at /mnt/checkpoints, when compiled with a volume."""
    if settings.checkpoint_volume:
        kubernetes.mount_pvc(task, pvc_name=claim, mount_path=MOUNT)
    return task
