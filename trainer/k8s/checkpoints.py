"""Checkpoints that outlive a pod: a ReadWriteMany PersistentVolumeClaim mounted on every training pod.

By default BackupAndRestore writes into the pod (MODEL_DIR.backup), which is enough for restarts in place
(`max_restarts`) but not for a pod that is replaced. A pipeline compiled with `--checkpoint-volume` mounts the
claim named by `checkpoint_claim` at `MOUNT` on every worker, and the workers checkpoint to `MOUNT/<run key>`. The
claim must be ReadWriteMany: a ReadWriteOnce volume can be attached to one node at a time, so ParallelFor pods on
other nodes wait for it to be released, and synchronous workers that wait for each other never finish.
"""

from __future__ import annotations

import os
from typing import Any

from trainer.config.contract import TrainConfig
from trainer.core.errors import UsageError

MOUNT = "/mnt/checkpoints"


def access_modes(name: str, api: Any = None) -> list[str]:
    """The access modes of claim `name` in this pod's namespace.

    Raises:
        UsageError: the claim does not exist.
        KubernetesError: the API refused to read it.
    """
    from kubernetes.client.exceptions import ApiException

    from trainer.k8s import objects

    api = api or objects.core_api()
    namespace = objects.namespace()
    try:
        claim = api.read_namespaced_persistent_volume_claim(name, namespace)
    except ApiException as err:
        if err.status == 404:
            raise UsageError(
                f"checkpoint_claim {name!r} does not exist in namespace {namespace!r}; allowed: the name of a "
                "ReadWriteMany PersistentVolumeClaim there, or empty"
            ) from None
        raise objects.explain(err, "get", "persistentvolumeclaims", namespace) from None
    return list(claim.spec.access_modes or [])


def check_claim(name: str, api: Any = None) -> None:
    """Refuses a claim that is not ReadWriteMany, saying why (see the module docstring)."""
    modes = access_modes(name, api)
    if "ReadWriteMany" not in modes:
        raise UsageError(
            f"checkpoint_claim {name!r} is {', '.join(modes) or 'without access modes'}; allowed: a ReadWriteMany "
            "claim. A ReadWriteOnce volume attaches to one node at a time, so workers on other nodes wait for it "
            "and synchronous training deadlocks"
        )


def on_claim(config: TrainConfig, api: Any = None) -> TrainConfig:
    """With `checkpoint_claim` set: checks the claim and its mount, and checkpoints to MOUNT by default.

    Homes are `ROOT/<run key>/<task>` whatever ROOT is (`trainer.cluster.resume.home_for`).
    """
    name = config.runtime.checkpoint_claim
    if not name:
        return config
    if not os.path.isdir(MOUNT):
        raise UsageError(
            f"checkpoint_claim {name!r} is set but nothing is mounted at {MOUNT}; compile the pipeline with "
            "--checkpoint-volume so that every training pod mounts the claim"
        )
    check_claim(name, api)
    if config.runtime.checkpoint_dir:
        return config
    return config.replace(checkpoint_dir=MOUNT)
