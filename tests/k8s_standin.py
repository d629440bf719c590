"""A small stand-in for the few Kubernetes API paths the pipeline calls, served over real HTTP by pytest-httpserver.

It keeps Services in memory, answers 201/409/404/403 like the API server, filters lists by label selector and
records every (verb, resource, namespace) it was asked for, so tests can compare them with the RBAC Role.
"""

import json
import re

from werkzeug import Request, Response

SERVICES = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/services(?:/(?P<name>[^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")


class KubeStandIn:
    def __init__(self, forbidden_namespaces=()):
        self.services: dict[tuple[str, str], dict] = {}
        self.pod_labels: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.forbidden = set(forbidden_namespaces)

    def install(self, httpserver):
        httpserver.expect_request(re.compile(r"^/api/v1/.*")).respond_with_handler(self.handle)

    @staticmethod
    def _status(code, reason, message):
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code}
        return Response(json.dumps(body), status=code, content_type="application/json")

    def handle(self, request: Request) -> Response:
        if m := SERVICES.match(request.path):
            resource, ns, name = "services", m["ns"], m["name"]
        elif m := PODS.match(request.path):
            resource, ns, name = "pods", m["ns"], m["name"]
        else:
            return self._status(404, "NotFound", f"no route {request.path}")
        verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch", "GET": "get" if name else "list"}[request.method]
        self.calls.append((verb, resource, ns))
        if ns in self.forbidden:
            return self._status(403, "Forbidden", f'{resource} is forbidden: User "system:serviceaccount:{ns}:default-editor" cannot {verb} resource "{resource}"')
        if resource == "pods":
            patch = request.get_json(force=True)
            self.pod_labels.setdefault((ns, name), {}).update(patch["metadata"]["labels"])
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": self.pod_labels[(ns, name)]}}
            return Response(json.dumps(pod), status=200, content_type="application/json")
        if verb == "create":
            body = request.get_json()
            key = (ns, body["metadata"]["name"])
            if key in self.services:
                return self._status(409, "AlreadyExists", f'services "{key[1]}" already exists')
            body["metadata"]["namespace"] = ns
            self.services[key] = body
            return Response(json.dumps(body), status=201, content_type="application/json")
        if verb == "list":
            wanted = dict(part.split("=", 1) for part in request.args.get("labelSelector", "").split(",") if part)
            items = [s for (n, _), s in self.services.items() if n == ns and wanted.items() <= s["metadata"].get("labels", {}).items()]
            return Response(json.dumps({"kind": "ServiceList", "apiVersion": "v1", "metadata": {}, "items": items}), status=200,
                            content_type="application/json")
        if verb == "delete":
            if self.services.pop((ns, name), None) is None:
                return self._status(404, "NotFound", f'services "{name}" not found')
            return Response(json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Success"}), status=200, content_type="application/json")
        return self._status(405, "MethodNotAllowed", verb)
