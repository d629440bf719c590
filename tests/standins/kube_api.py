"""The request handling of the Kubernetes API stand-in (`tests.standins.kube.KubeStandIn` mixes it in).

Verbs, Role checks, create/get/list/patch/replace/delete, what the kubelet and the garbage collector do; the state
(`self._objects`, `self.calls`, `self._version`, `self.role`, ...) belongs to `KubeStandIn`.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, NamedTuple

from werkzeug import Request, Response

from tests.standins import objects
from tests.standins.objects import PatchError, SelectorError

KINDS = {
    "pods": "Pod",
    "services": "Service",
    "events": "Event",
    "configmaps": "ConfigMap",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "secrets": "Secret",
    "endpoints": "Endpoints",
    "serviceaccounts": "ServiceAccount",
}
# Groups whose resources are built in and so accept a strategic merge patch; custom resources do not.
BUILT_IN_GROUPS = {
    "",
    "apps",
    "batch",
    "policy",
    "autoscaling",
    "networking.k8s.io",
    "rbac.authorization.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
}


class Target(NamedTuple):
    """What a request addresses: `key` is the resource as recorded (`services`, `workflows.argoproj.io`)."""

    key: str
    group: str
    api_version: str
    namespace: str
    name: str | None


class Failure(Exception):
    """An API error: its `body` is the Kubernetes `Status` the client receives."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.body = objects.status(code, reason, message, details)


def now() -> str:
    """The current time as the API writes it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def respond(body: Any, code: int = 200) -> Response:
    """A JSON response."""
    return Response(json.dumps(body), status=code, content_type="application/json")


class ApiHandlers:
    """The verbs of the API over the stand-in's state."""

    @staticmethod
    def _verb(request: Request, name: str | None) -> str:
        if request.method == "GET":
            return "get" if name else "watch" if request.args.get("watch") in ("true", "1") else "list"
        if request.method == "DELETE":
            return "delete" if name else "deletecollection"
        return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(request.method, request.method.lower())

    def _authorize(self, request: Request, verb: str, resource: str, target: Target) -> None:
        if self.token is not None:
            scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or presented.strip() != self.token:
                raise Failure(401, "Unauthorized", "Unauthorized")
        group, ns, name = target.group, target.namespace, target.name
        if ns in self.forbidden or (self.role and not objects.role_grants(self.role, group, resource, verb, name)):
            named = f' "{name}"' if name else ""
            raise Failure(
                403,
                "Forbidden",
                f'{target.key}{named} is forbidden: User "{self.user}" cannot {verb} '
                f'resource "{resource}" in API group "{group}" in the namespace "{ns}"',
                {"name": name or "", "group": group, "kind": resource},
            )

    def _dispatch(self, request: Request, verb: str, target: Target) -> tuple[int, Any]:
        key, ns, name = target.key, target.namespace, target.name
        if verb == "create" and not name:
            return 201, self._create(target, self._body(request), request.remote_addr)
        if verb in ("list", "deletecollection"):
            try:
                labels = objects.label_matcher(request.args.get("labelSelector"))
                fields = objects.field_matcher(request.args.get("fieldSelector"))
            except SelectorError as err:
                raise Failure(400, "BadRequest", str(err)) from None
            found = [
                (n, o)
                for (r, s, n), o in self._objects.items()
                if r == key and s == ns and labels(o["metadata"].get("labels", {})) and fields(o)
            ]
            if verb == "deletecollection":
                for found_name, _ in found:
                    del self._objects[(key, ns, found_name)]
            return 200, {
                "kind": self._kind(key, found) + "List",
                "apiVersion": target.api_version,
                "metadata": {"resourceVersion": str(self._version)},
                "items": [o for _, o in found],
            }
        if verb == "watch":
            raise Failure(405, "MethodNotAllowed", "the stand-in does not support watch")
        current = self._objects.get((key, ns, name))
        if (
            current is None and key == "pods" and verb in ("get", "patch")
        ):  # the kubelet made it before its container ran
            current = self._create(
                target,
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(self.pod_labels)}},
                request.remote_addr,
            )
        if current is None:
            raise Failure(404, "NotFound", f'{key} "{name}" not found', self._details(target))
        if verb == "get":
            return 200, current
        if verb == "delete":
            del self._objects[(key, ns, name)]
            self._collect_garbage(current["metadata"]["uid"])
            return 200, objects.status(200, "", "", {**self._details(target), "uid": current["metadata"]["uid"]})
        if verb == "patch":
            return 200, self._patch(request, target, current)
        if verb == "update":
            return 200, self._replace(target, current, self._body(request))
        raise Failure(405, "MethodNotAllowed", f"the server does not allow this method on {key}")

    def _create(self, target: Target, obj: Any, caller: str | None = None) -> dict:
        key, ns = target.key, target.namespace
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise Failure(400, "BadRequest", "the body is not an object with metadata")
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise Failure(422, "Invalid", f"{key} is invalid: metadata.name: Required value: name is required")
        if meta.get("namespace", ns) != ns:
            raise Failure(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if (key, ns, meta["name"]) in self._objects:
            raise Failure(
                409,
                "AlreadyExists",
                f'{key} "{meta["name"]}" already exists',
                self._details(target._replace(name=meta["name"])),
            )
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        obj.setdefault("kind", KINDS.get(key, key.split(".")[0].rstrip("s").capitalize()))
        obj.setdefault("apiVersion", target.api_version)
        if key == "pods":
            obj.setdefault("status", {"phase": "Pending"})
            self._kubelet(obj, caller)
        self._objects[(key, ns, meta["name"])] = obj
        return self._bump(obj)

    def _patch(self, request: Request, target: Target, current: dict) -> dict:
        kind, body = (request.mimetype or "").lower(), self._body(request)
        strategic = target.group in BUILT_IN_GROUPS
        try:
            if kind == "application/json-patch+json" and isinstance(body, list):
                patched = objects.json_patch(current, body)
            elif kind == "application/merge-patch+json" and isinstance(body, dict):
                patched = objects.merge_patch(current, body)
            elif kind == "application/strategic-merge-patch+json" and isinstance(body, dict) and strategic:
                patched = objects.merge_patch(current, body, strategic=True)
            else:
                accepted = "application/json-patch+json, application/merge-patch+json"
                accepted += ", application/strategic-merge-patch+json" if strategic else ""
                raise Failure(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: {accepted}",
                )
        except PatchError as err:
            raise Failure(422 if "test failed" in str(err) else 400, "Invalid", str(err)) from None
        updated = self._replace(target, current, patched, check_version=False)
        if target.key == "pods":
            self._kubelet(updated, request.remote_addr)
        return updated

    def _replace(self, target: Target, current: dict, new: Any, check_version: bool = True) -> dict:
        key, ns, name = target.key, target.namespace, target.name
        if not isinstance(new, dict) or (new.get("metadata") or {}).get("name") != name:
            raise Failure(400, "BadRequest", f"the name of the object ({name}) does not match the body")
        version = new["metadata"].get("resourceVersion")
        if check_version and version and version != current["metadata"]["resourceVersion"]:
            raise Failure(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {key} "{name}": the object has been '
                f"modified; please apply your changes to the latest version and try again",
            )
        for field in ("namespace", "uid", "creationTimestamp"):
            new["metadata"][field] = current["metadata"][field]
        spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in current.items() if k not in ("metadata", "status")
        }
        new["metadata"]["generation"] = current["metadata"].get("generation", 1) + int(spec_changed)
        if target.group in BUILT_IN_GROUPS and "status" in current:  # status is a subresource: kept as it was
            new["status"] = current["status"]
        self._objects[(key, ns, name)] = new
        return self._bump(new)

    def _collect_garbage(self, owner_uid: str) -> None:
        """The garbage collector: objects whose ownerReferences name a deleted object go too (and theirs)."""
        owned = [
            key
            for key, obj in self._objects.items()
            if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences", []))
        ]
        for key in owned:
            uid = self._objects.pop(key)["metadata"]["uid"]
            self._collect_garbage(uid)

    def _kubelet(self, pod: dict, caller: str | None) -> None:
        status = pod.setdefault("status", {})
        if caller and not status.get("podIP"):
            status.update(podIP=caller, podIPs=[{"ip": caller}], phase="Running")
            status["conditions"] = objects.running_conditions()

    def _bump(self, obj: dict) -> dict:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        return obj

    @staticmethod
    def _kind(key: str, found: list) -> str:
        return KINDS.get(key) or (found[0][1].get("kind") if found else None) or ""

    @staticmethod
    def _details(target: Target) -> dict[str, str]:
        details = {"name": target.name or "", "kind": target.key.split(".")[0]}
        return {**details, "group": target.group} if target.group else details

    @staticmethod
    def _body(request: Request) -> Any:
        try:
            return json.loads(request.get_data() or b"null")
        except ValueError as err:
            raise Failure(400, "BadRequest", f"the body is not JSON: {err}") from None
