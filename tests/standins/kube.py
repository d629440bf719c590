"""An in-memory Kubernetes API stand-in: a werkzeug WSGI app that the real `kubernetes` client talks to.

Generic over namespaced resources, core (`/api/v1/namespaces/{ns}/{resource}[/{name}]`) and grouped
(`/apis/{group}/{version}/namespaces/{ns}/{resource}[/{name}]`): create, get, list (label and field selectors),
patch (merge, strategic merge, JSON patch), replace, delete and deletecollection, with `Status` bodies for errors.
`metadata.generation` starts at 1 and grows when anything but metadata and status changes, as in the real API.
Every call is recorded as a `Call(verb, resource, namespace, name)` (grouped resources as `plural.group`, as
kubectl writes them) so tests can compare the calls with an RBAC Role; a Role can also be enforced.

Two behaviours stand in for the rest of a cluster:
- the kubelet: a pod read, PATCHed or created by a client at address A, and having no IP yet, gets `status.podIP` A
  and phase Running; a GET or PATCH of a pod that does not exist creates it first (the kubelet had, with
  `pod_labels`);
- cluster DNS: `dns_records()` maps `<svc>.<ns>.svc.<domain>` to the IPs of the pods its selector matches.

Serve it with `install(httpserver)` (pytest-httpserver, plain HTTP) or `serve_https(...)` (a thread); both
share the one state object.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import datetime, timezone
from typing import Any, NamedTuple

from werkzeug import Request, Response

from tests.standins import objects
from tests.standins.objects import PatchError, SelectorError
from tests.standins.serving import Served, serve

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)
KINDS = {
    "pods": "Pod",
    "services": "Service",
    "events": "Event",
    "configmaps": "ConfigMap",
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
DEFAULT_USER = "system:serviceaccount:kubeflow-user-example-com:default-editor"


class Call(NamedTuple):
    """One API request: `resource` is `services` for core resources and `workflows.argoproj.io` for grouped ones."""

    verb: str
    resource: str
    namespace: str
    name: str | None


class Target(NamedTuple):
    """What a request addresses: `key` is the resource as recorded (`services`, `workflows.argoproj.io`)."""

    key: str
    group: str
    api_version: str
    namespace: str
    name: str | None


class _Failure(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.body = objects.status(code, reason, message, details)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(body: Any, code: int = 200) -> Response:
    return Response(json.dumps(body), status=code, content_type="application/json")


class KubeStandIn:
    """The API state and its WSGI app. Thread-safe: one lock guards every request and every Python accessor.

    Args:
        token: when set, requests must carry `Authorization: Bearer <token>` (else 401 Unauthorized).
        forbidden_namespaces: namespaces where every request is refused with 403 Forbidden.
        role: an RBAC Role manifest; when set, requests it does not grant are refused with 403 Forbidden.
        user: the user named in 403 messages.
        cluster_domain: the DNS suffix of `dns_records()`.
        pod_labels: labels of a pod created because its container patched it (Argo labels every pod with its
            Workflow's name, KFP with the run id).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        forbidden_namespaces=(),
        role: dict | None = None,
        user: str = DEFAULT_USER,
        cluster_domain: str = "cluster.local",
        pod_labels: dict | None = None,
    ):
        self.pod_labels = dict(pod_labels or {})
        self.token = token
        self.forbidden = set(forbidden_namespaces)
        self.role = role
        self.user = user
        self.cluster_domain = cluster_domain
        self.calls: list[Call] = []
        self._objects: dict[tuple[str, str, str], dict] = {}
        self._version = 0
        self._lock = threading.RLock()

    # --- Python accessors for tests -------------------------------------------------------------------------

    def get(self, resource: str, namespace: str, name: str) -> dict | None:
        """A copy of one stored object, or None."""
        with self._lock:
            found = self._objects.get((resource, namespace, name))
            return objects.clone(found) if found else None

    def items(self, resource: str, namespace: str | None = None) -> dict[tuple[str, str], dict]:
        """Copies of the stored objects of one resource as {(namespace, name): object}, in creation order."""
        with self._lock:
            return {
                (ns, name): objects.clone(obj)
                for (res, ns, name), obj in self._objects.items()
                if res == resource and namespace in (None, ns)
            }

    def add(self, resource: str, namespace: str, obj: dict) -> dict:
        """Stores an object as if it had been created through the API (no call is recorded); returns it."""
        group = resource.partition(".")[2]
        api_version = obj.get("apiVersion") or "v1"
        with self._lock:
            created = self._create(Target(resource, group, api_version, namespace, None), objects.clone(obj))
            return objects.clone(created)

    def set_status(self, resource: str, namespace: str, name: str, status: dict) -> dict:
        """Replaces an object's status as its controller would (no call is recorded); returns the object."""
        with self._lock:
            obj = self._objects[(resource, namespace, name)]
            obj["status"] = objects.clone(status)
            return objects.clone(self._bump(obj))

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: dict | None = None,
        ip: str | None = None,
        phase: str | None = None,
        conditions: list[dict] | None = None,
        ready: bool = True,
    ) -> dict:
        """Stores a pod in any state, e.g. Pending with condition PodScheduled False, reason Unschedulable."""
        status: dict[str, Any] = {"phase": phase or ("Running" if ip else "Pending")}
        if ip:
            status.update(podIP=ip, podIPs=[{"ip": ip}])
        status["conditions"] = conditions if conditions is not None else objects.running_conditions(ready) if ip else []
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"containers": [{"name": "main", "image": "stand-in"}]},
            "status": status,
        }
        return self.add("pods", namespace, pod)

    def add_event(self, namespace: str, pod: str, reason: str, message: str, event_type: str = "Warning") -> dict:
        """Stores an Event about a pod, as the scheduler or kubelet would write it."""
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": event_type,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "default-scheduler"},
        }
        return self.add("events", namespace, event)

    def dns_records(self) -> dict[str, list[str]]:
        """{`<svc>.<ns>.svc.<domain>`: [pod IPs]} for every Service that selects at least one pod with an IP.

        Headless or not, a name resolves to the selected pods' IPs (there is no kube-proxy to send a cluster IP
        anywhere). Pods that are not Ready count only for a Service with `publishNotReadyAddresses`.
        """
        with self._lock:
            pods = [p for (res, _, _), p in self._objects.items() if res == "pods" and p["status"].get("podIP")]
            records = {}
            for (res, ns, name), svc in self._objects.items():
                spec = svc.get("spec", {})
                if res != "services" or not spec.get("selector"):
                    continue
                wanted = spec["selector"].items()
                ips = sorted(
                    {
                        p["status"]["podIP"]
                        for p in pods
                        if p["metadata"]["namespace"] == ns
                        and wanted <= p["metadata"].get("labels", {}).items()
                        and (spec.get("publishNotReadyAddresses") or objects.pod_ready(p))
                    }
                )
                if ips:
                    records[f"{name}.{ns}.svc.{self.cluster_domain}"] = ips
            return records

    # --- serving --------------------------------------------------------------------------------------------

    def install(self, httpserver) -> None:
        """Routes every `/api/...` and `/apis/...` request of a pytest-httpserver to this stand-in."""
        httpserver.expect_request(re.compile(r"^/apis?/")).respond_with_handler(self.handle)

    def serve_https(self, host: str, port: int, cert: str, key: str) -> Served:
        """Serves this stand-in over HTTPS from a daemon thread (port 0: any free port); stop it when done."""
        return serve(self, host, port, cert=cert, key=key)

    def __call__(self, environ, start_response):
        return self.handle(Request(environ))(environ, start_response)

    # --- the API --------------------------------------------------------------------------------------------

    def handle(self, request: Request) -> Response:
        """Answers one API request."""
        m = _PATH.match(request.path)
        if not m:
            return _json(objects.status(404, "NotFound", "the server could not find the requested resource"), 404)
        group, resource = m["group"] or "", m["resource"]
        target = Target(
            f"{resource}.{group}" if group else resource,
            group,
            f"{group}/{m['version']}" if group else "v1",
            m["ns"],
            m["name"],
        )
        verb = self._verb(request, target.name)
        with self._lock:
            self.calls.append(Call(verb, target.key, target.namespace, target.name))
            try:
                self._authorize(request, verb, resource, target)
                code, body = self._dispatch(request, verb, target)
            except _Failure as failure:
                return _json(failure.body, failure.body["code"])
            return _json(body, code)

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
                raise _Failure(401, "Unauthorized", "Unauthorized")
        group, ns, name = target.group, target.namespace, target.name
        if ns in self.forbidden or (self.role and not objects.role_grants(self.role, group, resource, verb, name)):
            named = f' "{name}"' if name else ""
            raise _Failure(
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
                raise _Failure(400, "BadRequest", str(err)) from None
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
            raise _Failure(405, "MethodNotAllowed", "the stand-in does not support watch")
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
            raise _Failure(404, "NotFound", f'{key} "{name}" not found', self._details(target))
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
        raise _Failure(405, "MethodNotAllowed", f"the server does not allow this method on {key}")

    def _create(self, target: Target, obj: Any, caller: str | None = None) -> dict:
        key, ns = target.key, target.namespace
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise _Failure(400, "BadRequest", "the body is not an object with metadata")
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise _Failure(422, "Invalid", f"{key} is invalid: metadata.name: Required value: name is required")
        if meta.get("namespace", ns) != ns:
            raise _Failure(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if (key, ns, meta["name"]) in self._objects:
            raise _Failure(
                409,
                "AlreadyExists",
                f'{key} "{meta["name"]}" already exists',
                self._details(target._replace(name=meta["name"])),
            )
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
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
                raise _Failure(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: {accepted}",
                )
        except PatchError as err:
            raise _Failure(422 if "test failed" in str(err) else 400, "Invalid", str(err)) from None
        updated = self._replace(target, current, patched, check_version=False)
        if target.key == "pods":
            self._kubelet(updated, request.remote_addr)
        return updated

    def _replace(self, target: Target, current: dict, new: Any, check_version: bool = True) -> dict:
        key, ns, name = target.key, target.namespace, target.name
        if not isinstance(new, dict) or (new.get("metadata") or {}).get("name") != name:
            raise _Failure(400, "BadRequest", f"the name of the object ({name}) does not match the body")
        version = new["metadata"].get("resourceVersion")
        if check_version and version and version != current["metadata"]["resourceVersion"]:
            raise _Failure(
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
            raise _Failure(400, "BadRequest", f"the body is not JSON: {err}") from None
