"""The parameter-server chief's status on a ConfigMap of the run, through the Kubernetes API.

The chief writes the ConfigMap `tfw-<run key>-status` in its namespace, owned by the run's Argo Workflow like the run's
Services, so it goes when the run is deleted; parameter servers and workers read it through the API, so no volume or
bucket is shared (`trainer.cluster.status` names the other stores and reads and writes the document, a
`ChiefStatus`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from trainer.cluster.status import KEY, StatusStore

log = logging.getLogger(__name__)

READ_TIMEOUT = 10.0


def configmap_name(run_id: str) -> str:
    """`tfw-<run key>-status`: the run's status ConfigMap."""
    from trainer.k8s import objects

    return f"tfw-{objects.run_key(run_id)}-status"


class ConfigMapStatus(StatusStore):
    """The status in a ConfigMap of this pod's namespace, through the Kubernetes API (in-cluster or KUBECONFIG)."""

    poll_seconds = 2.0

    def __init__(self, name: str, run_id: str = "", api: Any = None) -> None:
        from trainer.k8s import objects

        self.name = name
        self.run_id = run_id
        self.namespace = objects.namespace()
        self.where = f"configmap {self.namespace}/{name}"
        self._api = api
        self._created = False

    @property
    def api(self) -> Any:
        """The CoreV1Api, made on first use."""
        from trainer.k8s import objects

        if self._api is None:
            self._api = objects.core_api()
        return self._api

    def _manifest(self, data: dict[str, str]) -> dict[str, Any]:
        from trainer.k8s import objects

        labels = {"app.kubernetes.io/name": objects.APP, "app.kubernetes.io/component": "ps-status"}
        if self.run_id:
            labels.update(objects.run_labels(self.run_id))
        metadata: dict[str, Any] = {"name": self.name, "labels": labels}
        owner = objects.workflow_owner(self.api, self.namespace, objects.pod_name())
        if owner:
            metadata["ownerReferences"] = [owner]
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}

    def write(self, document: dict[str, Any]) -> None:
        """Creates the ConfigMap on the first write (a retried chief finds it and patches it), then patches it."""
        from kubernetes.client.exceptions import ApiException

        from trainer.k8s import objects

        data = {KEY: json.dumps(document, sort_keys=True)}
        if not self._created:
            try:
                self.api.create_namespaced_config_map(self.namespace, self._manifest(data))
                self._created = True
                log.info("created %s", self.where)
                return
            except ApiException as err:
                if err.status != 409:
                    raise objects.explain(err, "create", "configmaps", self.namespace) from None
                self._created = True
        try:
            self.api.patch_namespaced_config_map(self.name, self.namespace, {"data": data})
        except ApiException as err:
            raise objects.explain(err, "patch", "configmaps", self.namespace) from None

    def read(self) -> dict[str, Any] | None:
        """The document, or None while the ConfigMap does not exist."""
        from kubernetes.client.exceptions import ApiException

        from trainer.k8s import objects

        try:
            found = self.api.read_namespaced_config_map(self.name, self.namespace, _request_timeout=READ_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                return None
            raise objects.explain(err, "get", "configmaps", self.namespace) from None
        text = (found.data or {}).get(KEY)
        try:
            return json.loads(text) if text else None
        except ValueError:
            return None
