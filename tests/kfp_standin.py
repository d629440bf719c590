"""A small stand-in for the KFP v2beta1 REST endpoints the CLI calls, served over real HTTP by pytest-httpserver.

It keeps pipelines, versions, experiments, runs and recurring runs in memory, filters lists by the display-name
predicate kfp.Client sends, and records every request so tests can check what the real client put on the wire.
"""

import json
import re
import uuid

from werkzeug import Request, Response


def _json(body, status=200):
    return Response(json.dumps(body), status=status, content_type="application/json")


class KfpStandIn:
    def __init__(self):
        self.pipelines: dict[str, dict] = {}
        self.versions: dict[str, list[dict]] = {}
        self.experiments: dict[str, dict] = {}
        self.runs: list[dict] = []
        self.recurring_runs: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.fail_with: int | None = None

    def install(self, httpserver):
        httpserver.expect_request(re.compile(r"^/apis/v2beta1/.*")).respond_with_handler(self.handle)

    @staticmethod
    def _name_filter(request: Request):
        raw = request.args.get("filter")
        if not raw:
            return None
        predicates = json.loads(raw)["predicates"]
        return next(p.get("stringValue", p.get("string_value")) for p in predicates if p["key"] == "display_name")

    def _new_version(self, pipeline_id, name, request):
        version = {
            "pipeline_id": pipeline_id,
            "pipeline_version_id": str(uuid.uuid4()),
            "display_name": name,
            "uploaded_bytes": len(request.files["uploadfile"].read()),
        }
        self.versions.setdefault(pipeline_id, []).append(version)
        return version

    def handle(self, request: Request) -> Response:
        path, method = request.path, request.method
        self.requests.append((method, path))
        if self.fail_with and path != "/apis/v2beta1/healthz":
            return _json(
                {"error": "database is locked", "code": 13, "message": "internal: database is locked"}, self.fail_with
            )
        if path == "/apis/v2beta1/healthz":
            return _json({"multi_user": False})
        if path == "/apis/v2beta1/pipelines" and method == "GET":
            name = self._name_filter(request)
            found = [p for p in self.pipelines.values() if name is None or p["display_name"] == name]
            return _json({"pipelines": found, "total_size": len(found)} if found else {})
        if path == "/apis/v2beta1/pipelines/upload" and method == "POST":
            name = request.args["name"]
            if any(p["display_name"] == name for p in self.pipelines.values()):
                return _json({"message": f"pipeline {name} already exists", "code": 6}, 409)
            pipeline = {
                "pipeline_id": str(uuid.uuid4()),
                "display_name": name,
                "namespace": request.args.get("namespace", ""),
            }
            self.pipelines[pipeline["pipeline_id"]] = pipeline
            self._new_version(pipeline["pipeline_id"], name, request)
            return _json(pipeline)
        if path == "/apis/v2beta1/pipelines/upload_version" and method == "POST":
            pipeline_id = request.args["pipelineid"]
            if pipeline_id not in self.pipelines:
                return _json({"message": "pipeline not found", "code": 5}, 404)
            return _json(self._new_version(pipeline_id, request.args["name"], request))
        if m := re.fullmatch(r"/apis/v2beta1/pipelines/([^/]+)/versions", path):
            return _json(
                {"pipeline_versions": self.versions.get(m[1], []), "total_size": len(self.versions.get(m[1], []))}
            )
        if path == "/apis/v2beta1/experiments" and method == "GET":
            name = self._name_filter(request)
            found = [e for e in self.experiments.values() if e["display_name"] == name]
            return _json({"experiments": found, "total_size": len(found)} if found else {})
        if path == "/apis/v2beta1/experiments" and method == "POST":
            body = request.get_json()
            experiment = {
                "experiment_id": str(uuid.uuid4()),
                "display_name": body["display_name"],
                "namespace": body.get("namespace", ""),
            }
            self.experiments[experiment["experiment_id"]] = experiment
            return _json(experiment)
        if path == "/apis/v2beta1/runs" and method == "POST":
            run = {**request.get_json(), "run_id": str(uuid.uuid4()), "state": "PENDING"}
            self.runs.append(run)
            return _json(run)
        if path == "/apis/v2beta1/recurringruns" and method == "POST":
            recurring = {**request.get_json(), "recurring_run_id": str(uuid.uuid4()), "status": "ENABLED"}
            self.recurring_runs.append(recurring)
            return _json(recurring)
        return _json({"message": f"no route {method} {path}", "code": 5}, 404)
