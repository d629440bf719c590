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
from pathlib import Path
from typing import Any, NamedTuple

from werkzeug import Request, Response

from tests.standins import objects
from tests.standins.kube_api import ApiHandlers, Failure, Target, now, respond
from tests.standins.serving import Served, serve

_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?/?$"
)
DEFAULT_USER = "system:serviceaccount:kubeflow-user-example-com:default-editor"


class Call(NamedTuple):
    """One API request: `resource` is `services` for core resources and `workflows.argoproj.io` for grouped ones."""

    verb: str
    resource: str
    namespace: str
    name: str | None


class KubeStandIn(ApiHandlers):
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
        stamp = now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:16]}"},
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": pod, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": event_type,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": "default-scheduler"},
        }
        return self.add("events", namespace, event)

    def dns_records(self) -> dict[str, list[str]]:
        """{`<svc>.<ns>.svc.<domain>`: [pod IPs]} for every Service that selects at least one pod with an IP.

        Headless or not, a name resolves to the selected pods' IPs (there is no kube-proxy to send a cluster IP
        anywhere). Pods that are not Ready count only for a Service with `publishNotReadyAddresses`; pods that have
        ended (Failed, Succeeded) never do, as the EndpointSlice controller leaves terminal pods out.
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
                        and not objects.pod_terminal(p)
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
            return respond(objects.status(404, "NotFound", "the server could not find the requested resource"), 404)
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
            except Failure as failure:
                return respond(failure.body, failure.body["code"])
            return respond(body, code)


def write_kubeconfig(path: Path, url: str, namespace: str | None = None) -> Path:
    """A kubeconfig at PATH for the stand-in at URL (token auth), with NAMESPACE as the context's namespace if given."""
    context = {"cluster": "standin", "user": "runner", **({"namespace": namespace} if namespace else {})}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": url}}],
        "users": [{"name": "runner", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": context}],
        "current-context": "c",
    }
    path.write_text(json.dumps(config))
    return path
