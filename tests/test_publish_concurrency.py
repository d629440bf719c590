"""Many runs publishing to one publish_uri at once: a path, moto's S3 server (IAM on) and a GCS JSON-API stand-in.

Every publisher is the real `trainer.publishing.publish.publish` in its own process (spawned, so nothing is shared but
the store), started together behind a barrier and all given the same second as their clock, so that they claim
the same version numbers and race on `latest.json`. The end state is checked from outside the code under test:
`latest.json` names the best model by the gate's metric and the highest version; every version reported published
is complete (its own model's files, byte for byte, and a `metrics.json` naming it) under its own number; the
losers' versions and claims are gone; no staging copy is left.

The models are tiny directories with a `saved_model.pb` (publish only checks that it is there), each file holding
its model's name, so a version mixing two models' files would be seen.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import signal
import threading
import urllib.parse
import uuid
from datetime import datetime, timezone

import pytest
from werkzeug import Request, Response

from tests.standins.s3 import BUCKET, FaultyProxy, S3Server
from tests.standins.serving import serve
from tests.support.processes import wait_for
from trainer.config.gate import Gate
from trainer.core.files import json_bytes
from trainer.publishing.publish import SPREAD, STALE_CLAIM, latest, publish

SECOND = 1_900_000_000
ACCURACIES = [0.81, 0.95, 0.88, 0.99, 0.84, 0.90, 0.86, 0.93]
LOSSES = [0.40, 0.12, 0.30, 0.09, 0.35, 0.20, 0.31, 0.15]
MODEL_FILES = [
    "saved_model.pb",
    "fingerprint.pb",
    "variables/variables.data-00000-of-00001",
    "variables/variables.index",
]
GCS_BUCKET = "models"


def _model(root, name: str) -> str:
    """A fake SavedModel directory whose every file says which model it is."""
    path = root / name
    for rel in MODEL_FILES:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"{name}:{rel}")
    return str(path)


# --- the stores, seen from outside the code under test -------------------------------------------------------


class PathView:
    """A publish location on a path."""

    def __init__(self, tmp_path):
        self.uri = str(tmp_path / "published")
        self.endpoint = ""
        self.env: dict[str, str] = {}

    def files(self) -> dict[str, bytes]:
        out = {}
        for root, _, names in os.walk(self.uri):
            for name in names:
                full = os.path.join(root, name)
                out[os.path.relpath(full, self.uri)] = open(full, "rb").read()
        return out

    def write(self, rel: str, data: bytes) -> None:
        full = os.path.join(self.uri, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        open(full, "wb").write(data)


class S3View:
    """A publish location in moto's S3 server."""

    def __init__(self, server: S3Server, endpoint: str = ""):
        self.server = server
        self.prefix = f"m-{uuid.uuid4().hex[:6]}"
        self.uri = f"s3://{BUCKET}/{self.prefix}"
        self.endpoint = endpoint or server.url
        self.env = server.publisher.env()

    def files(self) -> dict[str, bytes]:
        keys = self.server.keys(self.prefix + "/")
        return {k[len(self.prefix) + 1 :]: self.server.read(k) for k in keys}

    def write(self, rel: str, data: bytes) -> None:
        self.server.client(self.server.publisher).put_object(Bucket=BUCKET, Key=f"{self.prefix}/{rel}", Body=data)


class GcsView:
    """A publish location in the GCS stand-in."""

    def __init__(self, server: GcsStandIn):
        self.server = server
        self.prefix = f"m-{uuid.uuid4().hex[:6]}"
        self.uri = f"gs://{GCS_BUCKET}/{self.prefix}"
        self.endpoint = ""
        self.env = server.env()

    def files(self) -> dict[str, bytes]:
        return self.server.files(GCS_BUCKET, self.prefix + "/")


def _versions(files: dict[str, bytes]) -> dict[int, dict[str, bytes]]:
    out: dict[int, dict[str, bytes]] = {}
    for rel, data in files.items():
        head, _, rest = rel.partition("/")
        if head.isdigit():
            out.setdefault(int(head), {})[rest] = data
    return out


def check_end_state(view, results: list[dict], metric: str, higher_is_better: bool) -> list[int]:
    """Asserts what concurrent publishing must leave behind; returns the published version numbers."""
    files = view.files()
    by_version = _versions(files)
    published = {r["version"]: r for r in results if r["published"]}
    assert sorted(published) == sorted(by_version), "exactly the versions reported published are there"
    assert len(published) == sum(r["published"] for r in results), "no two runs share a number"
    for number, result in published.items():
        model = result["model"]
        expected = {rel: f"{model}:{rel}".encode() for rel in MODEL_FILES}
        got = {rel: data for rel, data in by_version[number].items() if rel != "metrics.json"}
        assert got == expected, f"version {number} holds exactly {model}'s files"
        record = json.loads(by_version[number]["metrics.json"])
        assert record["version"] == number and record["path"] == f"{view.uri}/{number}"
        assert record["lineage"]["run_id"] == model and record["metrics"][metric] == result["value"]
    pick = max if higher_is_better else min
    best = pick(results, key=lambda r: r["value"])
    doc = json.loads(files["latest.json"])
    assert doc["lineage"]["run_id"] == best["model"], f"latest.json names the best model ({best['model']})"
    assert best["published"] and doc["version"] == best["version"] == max(by_version), "and the highest version"
    assert doc == json.loads(by_version[doc["version"]]["metrics.json"])
    claims = sorted(int(rel.split("/")[1]) for rel in files if rel.startswith(".claims/"))
    assert claims == sorted(published), "a claim for each published version, none for a withdrawn one"
    leftovers = [rel for rel in files if rel.startswith(".staging-") or rel.startswith(".conditional-probe-")]
    assert leftovers == [], "nothing staged is left"
    for result in results:
        if not result["published"]:
            assert result["reason"].startswith(f"not published: {metric} "), result["reason"]
    return sorted(published)


# --- publishers in their own processes -------------------------------------------------------------------------


def _publish_in_child(barrier, results, model_dir, model, value, uri, endpoint, env, metric, higher_is_better):
    """A spawned run: its own environment (credentials), then publish once the others are ready too."""
    os.environ.update(env)
    logging.basicConfig(level=logging.INFO, format=f"{model}: %(message)s")
    gate = Gate(metric, higher_is_better, 0.0)
    metrics = {metric: value}
    barrier.wait(timeout=60)
    try:
        result = publish(model_dir, metrics, uri, {"run_id": model}, endpoint, gate=gate, clock=lambda: SECOND)
        results.put({"model": model, "value": value, **vars_of(result)})
    except BaseException as err:
        results.put({"model": model, "value": value, "error": f"{type(err).__name__}: {err}"})
        raise


def vars_of(result) -> dict:
    """What the parent checks of a Publication."""
    return {"published": result.published, "version": result.version, "reason": result.reason}


def run_concurrently(view, models: dict[str, str], values: list[float], metric: str, higher_is_better: bool):
    """Publishes every model from its own spawned process at once; their results."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(models))
    results = context.Queue()
    processes = [
        context.Process(
            target=_publish_in_child,
            args=(barrier, results, path, name, value, view.uri, view.endpoint, view.env, metric, higher_is_better),
        )
        for (name, path), value in zip(models.items(), values, strict=True)
    ]
    try:
        for process in processes:
            process.start()
        collected = [results.get(timeout=120) for _ in processes]
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    errors = [r["error"] for r in collected if "error" in r]
    assert errors == [], errors
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return collected


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def models(tmp_path):
    return {f"model-{i}": _model(tmp_path / "models", f"model-{i}") for i in range(len(ACCURACIES))}


def _report(results) -> str:
    return ", ".join(
        f"{r['model']}={r['value']}:{r['version'] if r['published'] else 'withdrawn/refused'}"
        for r in sorted(results, key=lambda r: r["value"])
    )


def test_eight_runs_publishing_to_one_path_at_once_end_with_the_best_named(tmp_path, models):
    view = PathView(tmp_path)
    results = run_concurrently(view, models, ACCURACIES, "accuracy", True)
    published = check_end_state(view, results, "accuracy", True)
    assert all(v >= SECOND for v in published)
    assert latest(view.uri).lineage["run_id"] == "model-3"
    print("path:", _report(results))


def test_eight_runs_publishing_to_one_s3_prefix_at_once_end_with_the_best_named(tmp_path, models, s3):
    """Under a `loss<=` gate: the lowest loss wins, on moto's S3 server with If-None-Match and If-Match."""
    view = S3View(s3)
    results = run_concurrently(view, models, LOSSES, "loss", False)
    published = check_end_state(view, results, "loss", False)
    assert all(v >= SECOND for v in published)
    print("s3:", _report(results))


# --- deterministic interleavings ------------------------------------------------------------------------------


@pytest.fixture(params=["path", "s3"])
def view(request, tmp_path, monkeypatch):
    if request.param == "s3":
        server = request.getfixturevalue("s3")
        for name, value in server.publisher.env().items():
            monkeypatch.setenv(name, value)
        return S3View(server)
    return PathView(tmp_path)


def _publish(view, model_dir, accuracy, clock=lambda: SECOND, endpoint=None, nonce=None):
    name = os.path.basename(model_dir)
    return publish(
        model_dir,
        {"accuracy": accuracy},
        view.uri,
        {"run_id": name},
        view.endpoint if endpoint is None else endpoint,
        clock=clock,
        **({"nonce": nonce} if nonce is not None else {}),
    )


def _parts(*values: int):
    """A `nonce` that draws `values` in turn: the random parts of version numbers, chosen by the test."""
    drawn = iter(values)
    return lambda: next(drawn)


def _outcome(model: str, value: float, result) -> dict:
    return {"model": model, "value": value, **vars_of(result)}


def test_runs_in_the_same_second_get_the_next_free_number(view, models):
    """The clock says the same second every time: each run takes the next number, a claimed one included."""
    first = _publish(view, models["model-0"], 0.90)
    second = _publish(view, models["model-1"], 0.91)
    assert (first.version, second.version) == (SECOND, SECOND + 1)
    # Another run has claimed the next number and is still copying its version: this one skips it.
    other = b'{"claimed_by": "another run"}'
    claim = os.path.join(view.uri, ".claims", str(SECOND + 2))
    if isinstance(view, S3View):
        view.server.client(view.server.publisher).put_object(
            Bucket=BUCKET, Key=f"{view.prefix}/.claims/{SECOND + 2}", Body=other
        )
    else:
        open(claim, "wb").write(other)
    third = _publish(view, models["model-2"], 0.92)
    assert third.published and third.version == SECOND + 3
    assert third.reason == f"published version {SECOND + 3} with accuracy 0.9200 (previous 0.9100)"
    files = view.files()
    assert files[f".claims/{SECOND + 2}"] == other, "another run's claim is left alone"
    assert sorted(_versions(files)) == [SECOND, SECOND + 1, SECOND + 3]
    assert json.loads(files["latest.json"])["version"] == SECOND + 3


def test_a_model_that_loses_after_its_upload_is_withdrawn(view, models):
    """Run A reads latest.json (nothing yet) and uploads; meanwhile run B publishes a better model; A withdraws.

    B runs inside A's clock, which A reads after its upload and before claiming its number.
    """
    calls = []

    def clock():
        calls.append(1)
        if len(calls) == 2:
            assert _publish(view, models["model-1"], 0.97).version == SECOND
        return SECOND

    a = _publish(view, models["model-0"], 0.95, clock=clock)
    assert len(calls) >= 2
    assert not a.published
    assert a.reason == f"not published: accuracy 0.9500 is below the published version {SECOND} (0.9700)"
    assert a.previous is not None and a.previous.lineage["run_id"] == "model-1"
    files = view.files()
    assert sorted(_versions(files)) == [SECOND]
    assert sorted(rel for rel in files if rel.startswith(".")) == [f".claims/{SECOND}"] + (
        [".latest.json.lock"] if isinstance(view, PathView) else []
    ), "A's version, claim and staging copy are gone"
    assert json.loads(files["latest.json"])["lineage"]["run_id"] == "model-1"


def test_a_better_model_overtaken_by_a_higher_number_moves_above_it(s3, models, monkeypatch):
    """A (0.95) has copied its version N and sends its latest.json; just before it lands, B (0.90) publishes N+1.

    A's conditional PUT is refused (412), A reads B, which is worse but numbered higher (TF Serving would serve
    it): A moves its version above B's and replaces latest.json. B's version stays, complete and published.
    """
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    view = S3View(s3)
    outcome = {}

    def before_latest(request):
        if request.method == "PUT" and request.path.endswith("/latest.json") and "b" not in outcome:
            outcome["b"] = _publish(view, models["model-1"], 0.90)
        return False

    proxy = FaultyProxy(s3.url, before_latest)
    try:
        a = _publish(view, models["model-0"], 0.95, endpoint=proxy.url)
    finally:
        proxy.stop()
    b = outcome["b"]
    assert b.published and b.version == SECOND + 1, "B numbered above A's version, which it saw"
    assert a.published and a.version == SECOND + 2
    assert a.reason == f"published version {SECOND + 2} with accuracy 0.9500 (previous 0.9000)"
    puts = [
        path for method, path, _ in proxy.requests if method == "PUT" and path.split("?")[0].endswith("/latest.json")
    ]
    assert len(puts) == 2, "A's first conditional PUT of latest.json was refused, its second one landed"
    files = view.files()
    assert sorted(_versions(files)) == [SECOND + 1, SECOND + 2], "A's first number was given up"
    assert sorted(rel for rel in files if rel.startswith(".claims/")) == [
        f".claims/{SECOND + 1}",
        f".claims/{SECOND + 2}",
    ]
    doc = json.loads(files["latest.json"])
    assert doc["version"] == SECOND + 2 and doc["lineage"]["run_id"] == "model-0"
    assert json.loads(files[f"{SECOND + 2}/metrics.json"]) == doc
    assert not [rel for rel in files if rel.startswith(".staging-")]


class IgnoresConditions(FaultyProxy):
    """A proxy in front of moto that answers like an S3 server ignoring If-None-Match and If-Match.

    A conditional PUT of a probe object that exists already gets 200, as from an old SeaweedFS that writes it;
    everything else reaches moto unchanged, after `before(request)` (which may run another publish first, so that
    its requests land between this request's sending and its arrival).
    """

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream, lambda request: False)
        self.probes: list[str] = []
        self.conditional: list[str] = []
        self.before = lambda request: None

    def __call__(self, environ, start_response):
        request = Request(environ)
        conditional = "If-None-Match" in request.headers or "If-Match" in request.headers
        if request.method == "PUT" and "/.conditional-probe-" in request.path and conditional:
            self.probes.append(request.path)
            if self.probes.count(request.path) > 1:
                self.requests.append((request.method, request.full_path, False))
                headers = {"ETag": '"' + hashlib.md5(request.get_data()).hexdigest() + '"'}  # noqa: S324
                return Response(b"", status=200, headers=headers)(environ, start_response)
        if request.method == "PUT" and conditional and "/.conditional-probe-" not in request.path:
            self.conditional.append(request.path)
        self.before(request)
        return super().__call__(environ, start_response)


@pytest.fixture
def ignoring(s3, monkeypatch):
    """A fresh prefix in moto behind a proxy that ignores conditional writes, and the proxy."""
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    proxy = IgnoresConditions(s3.url)
    yield S3View(s3, proxy.url), proxy
    proxy.stop()


BASE = SECOND * SPREAD  # the lowest number on a store that ignores conditions, in the second all these runs share


def test_a_store_that_ignores_conditional_writes_is_found_and_said(ignoring, models, caplog):
    view, proxy = ignoring
    with caplog.at_level(logging.WARNING, logger="trainer.publishing.conditional"):
        first = _publish(view, models["model-0"], 0.90, nonce=_parts(417))
        second = _publish(view, models["model-1"], 0.92, nonce=_parts(3))
    warnings = [r.getMessage() for r in caplog.records if "ignores conditional writes" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0].startswith(f"s3://{BUCKET} at {proxy.url} ignores conditional writes")
    assert "does not exclude two runs publishing at the same moment" in warnings[0]
    assert "can still leave a version mixing two models or latest.json naming the worse one" in warnings[0]
    assert len(proxy.probes) == 4 and len(set(proxy.probes)) == 2, "each publish probed: a create, a second create"
    assert proxy.conditional == [], "then claims and latest.json are written without conditions, and read back"
    assert (first.version, second.version) == (BASE + 417, BASE + 418 + 3), "seconds * 1000 + a random part"
    assert second.published
    files = view.files()
    assert json.loads(files["latest.json"])["version"] == BASE + 421
    assert not [rel for rel in files if rel.startswith((".staging-", ".conditional-probe-"))]


def test_ignoring_store_two_runs_that_both_read_a_claim_absent_keep_their_own_versions(ignoring, models):
    """A reads `.claims/N` absent and sends its claim; before it lands, B reads it absent too and publishes whole.

    Both claims read back as their writer's. With one number per second both would own it: A would copy its
    model over B's published version and then, moving above B, delete it. With a random part they differ.
    """
    view, proxy = ignoring
    outcome = {}

    def before(request):
        if request.method == "PUT" and "/.claims/" in request.path and "b" not in outcome:
            outcome["b"] = None
            outcome["b"] = _publish(view, models["model-1"], 0.90, nonce=_parts(2))

    proxy.before = before
    a = _publish(view, models["model-0"], 0.95, nonce=_parts(1, 3))
    b = outcome["b"]
    results = [_outcome("model-0", 0.95, a), _outcome("model-1", 0.90, b)]
    check_end_state(view, results, "accuracy", True)
    assert (b.version, a.version) == (BASE + 2, BASE + 6), "A moved above B's number: from BASE + 3, drawing 3"


def test_ignoring_store_a_number_that_holds_a_version_is_not_used(ignoring, models, caplog):
    """As above, but B draws the same number as A: A's claim reads back as A's, yet the number holds B's version."""
    view, proxy = ignoring
    outcome = {}

    def before(request):
        if request.method == "PUT" and "/.claims/" in request.path and "b" not in outcome:
            outcome["b"] = None
            outcome["b"] = _publish(view, models["model-1"], 0.90, nonce=_parts(1))

    proxy.before = before
    with caplog.at_level(logging.WARNING, logger="trainer.publishing.publish"):
        a = _publish(view, models["model-0"], 0.95, nonce=_parts(1, 5))
    b = outcome["b"]
    results = [_outcome("model-0", 0.95, a), _outcome("model-1", 0.90, b)]
    check_end_state(view, results, "accuracy", True)
    assert (b.version, a.version) == (BASE + 1, BASE + 5)
    assert f"version {BASE + 1} holds another run's version though its claim read back as this run's" in caplog.text


def test_ignoring_store_a_claim_taken_over_during_promotion_leaves_the_number(ignoring, s3, models, caplog):
    """Another run's claim of the same number lands while A copies its SavedModel: A leaves it and takes another."""
    view, proxy = ignoring
    other = b'{"claimed_by": "another run"}'
    taken = []

    def before(request):
        copying = request.method == "PUT" and "x-amz-copy-source" in request.headers
        if copying and request.path.endswith("/saved_model.pb") and not taken:
            taken.append(request.path.split("/")[-2])
            view.write(f".claims/{taken[0]}", other)

    proxy.before = before
    with caplog.at_level(logging.WARNING, logger="trainer.publishing.publish"):
        a = _publish(view, models["model-0"], 0.95, nonce=_parts(7, 0))
    assert taken == [str(BASE + 7)]
    assert a.published and a.version == BASE + 8, "above the number left, drawing 0"
    assert f"version {BASE + 7}: another run claimed it at the same moment" in caplog.text
    files = view.files()
    assert files[f".claims/{BASE + 7}"] == other, "the number is left to the run that claimed it"
    assert json.loads(files["latest.json"])["version"] == BASE + 8
    assert files[f".claims/{BASE + 8}"] != other


def test_ignoring_store_a_worse_model_that_overwrote_latest_json_names_the_better_again(ignoring, models):
    """A (0.90) sends latest.json; before it lands, B (0.95) publishes whole; then A's write overwrites B's.

    Both read back their own write. A then finds B's version, promoted since A read latest.json and better: it
    names B in latest.json again and withdraws its own.
    """
    view, proxy = ignoring
    outcome = {}

    def before(request):
        if request.method == "PUT" and request.path.endswith("/latest.json") and "b" not in outcome:
            outcome["b"] = None
            outcome["b"] = _publish(view, models["model-1"], 0.95, nonce=_parts(2))

    proxy.before = before
    a = _publish(view, models["model-0"], 0.90, nonce=_parts(1))
    b = outcome["b"]
    results = [_outcome("model-0", 0.90, a), _outcome("model-1", 0.95, b)]
    check_end_state(view, results, "accuracy", True)
    assert b.published and b.version == BASE + 4, "above A's version BASE + 1, which it saw"
    assert not a.published
    assert a.reason == f"not published: accuracy 0.9000 is below the published version {BASE + 4} (0.9500)"


def test_ignoring_store_a_worse_version_numbered_above_the_named_one_is_overtaken(ignoring, models, tmp_path):
    """Right after A named its version, another run's worse version appears numbered above it: A moves above."""
    view, proxy = ignoring
    other = _model(tmp_path, "model-other")
    above = BASE + 500
    placed = []

    def before(request):
        if request.method == "PUT" and request.path.endswith("/latest.json") and not placed:
            placed.append(above)
            _leave_version(view, above, other, 0.80, claimed_at=SECOND)

    proxy.before = before
    a = _publish(view, models["model-0"], 0.95, nonce=_parts(1, 9))
    assert a.published and a.version == above + 1 + 9
    files = view.files()
    assert sorted(_versions(files)) == [above, above + 10], "A's first number was given up; the other is its run's"
    assert json.loads(files["latest.json"])["version"] == above + 10


def test_s3_a_server_rejecting_if_none_match_is_used_without_conditions(s3, models, monkeypatch, caplog):
    """A server that answers the probe's first conditional create with 400 or 501 rather than ignoring it."""
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    for status, code in ((501, "NotImplemented"), (400, "InvalidArgument")):
        proxy = RejectsConditions(s3.url, status, code)
        view = S3View(s3, proxy.url)
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO, logger="trainer.publishing.conditional"):
                result = _publish(view, models["model-0"], 0.90, nonce=_parts(11))
        finally:
            proxy.stop()
        assert result.published and result.version == BASE + 11, (status, result)
        assert f"{view.uri} answered a create with If-None-Match: * with {status} {code}" in caplog.text
        assert "ignores conditional writes" in caplog.text
        assert proxy.rejected == 1, "only the probe's first create carried a condition"
        assert sorted(_versions(view.files())) == [BASE + 11]


class RejectsConditions(FaultyProxy):
    """A proxy in front of moto that answers `status` `code` to every PUT carrying If-None-Match or If-Match."""

    def __init__(self, upstream: str, status: int, code: str) -> None:
        super().__init__(upstream, lambda request: False)
        self.status, self.code, self.rejected = status, code, 0

    def __call__(self, environ, start_response):
        request = Request(environ)
        if request.method == "PUT" and ("If-None-Match" in request.headers or "If-Match" in request.headers):
            self.rejected += 1
            body = f"<Error><Code>{self.code}</Code><Message>conditional writes are not implemented</Message></Error>"
            return Response(body.encode(), status=self.status, content_type="application/xml")(environ, start_response)
        return super().__call__(environ, start_response)


# --- runs stopped between promotion and latest.json ------------------------------------------------------------


def _leave_version(view, number: int, model_dir: str, accuracy: float, claimed_at: float) -> None:
    """A complete version with its dated claim, as a run stopped before naming it in latest.json leaves it."""
    name = os.path.basename(model_dir)
    for rel in MODEL_FILES:
        view.write(f"{number}/{rel}", open(os.path.join(model_dir, rel), "rb").read())
    record = {"version": number, "path": f"{view.uri}/{number}", "metrics": {"accuracy": accuracy}}
    view.write(f"{number}/metrics.json", json_bytes({**record, "lineage": {"run_id": name}}))
    claim = {"claimed_by": "a stopped run", "run_id": name, "claimed_at": claimed_at}
    view.write(f".claims/{number}", json_bytes(claim))


def test_versions_left_above_latest_by_stopped_runs_are_withdrawn_after_an_hour(view, models, tmp_path, caplog):
    """Above latest.json's version: one claimed an hour ago is withdrawn, a younger one is left to its run."""
    assert _publish(view, models["model-0"], 0.90).version == SECOND
    dead, young, below = _model(tmp_path, "dead"), _model(tmp_path, "young"), _model(tmp_path, "below")
    _leave_version(view, SECOND + 5, dead, 0.99, claimed_at=SECOND)
    _leave_version(view, SECOND + 7, young, 0.98, claimed_at=SECOND + 1)
    _leave_version(view, SECOND - 9, below, 0.97, claimed_at=SECOND - 9)
    now = SECOND + STALE_CLAIM
    with caplog.at_level(logging.INFO, logger="trainer.publishing.publish"):
        result = _publish(view, models["model-1"], 0.91, clock=lambda: now)
    assert result.published and result.version == now
    withdrawn = [r.getMessage() for r in caplog.records if r.getMessage().startswith("withdrew version")]
    assert withdrawn == [
        f"withdrew version {SECOND + 5}: claimed 3600 s ago by run 'dead', which never named it in latest.json "
        "(stopped between its claim and latest.json); TF Serving would have served it as the highest number"
    ]
    assert f"version {SECOND + 7} above latest.json's, claimed 3599 s ago: left to the run publishing it" in caplog.text
    files = view.files()
    assert sorted(_versions(files)) == [SECOND - 9, SECOND, SECOND + 7, now], "below latest.json's: not served, left"
    assert sorted(rel for rel in files if rel.startswith(".claims/")) == [
        f".claims/{n}" for n in sorted([SECOND - 9, SECOND, SECOND + 7, now], key=str)
    ]


def _publish_until_stopped(model_dir: str, uri: str, second: int) -> None:
    """A spawned publish step (run_step: the exit-code contract) with `second` as its clock."""
    from trainer.core.entry import run_step

    run_step(
        publish,
        saved_model_dir=model_dir,
        metrics={"accuracy": 0.97},
        publish_uri=uri,
        lineage={"run_id": "stopped"},
        clock=lambda: second,
    )


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_publish_stopped_between_promotion_and_latest_json_leaves_no_version_above_it(tmp_path, models, capfd, stop):
    """The step has promoted its version and waits for latest.json's lock, which the test holds; then it is stopped.

    SIGTERM (Kubernetes stopping the pod): the step withdraws its version and ends with 143. SIGKILL: the version
    is left above latest.json's, where TF Serving would serve it; a publish within the hour leaves it to its run,
    the first one an hour after its claim withdraws it.
    """
    view = PathView(tmp_path)
    assert _publish(view, models["model-0"], 0.90).version == SECOND
    stopped = SECOND + 1
    context = multiprocessing.get_context("spawn")
    with open(os.path.join(view.uri, ".latest.json.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        child = context.Process(target=_publish_until_stopped, args=(models["model-1"], view.uri, stopped))
        child.start()
        try:
            wait_for(lambda: os.path.isdir(os.path.join(view.uri, str(stopped))), "the promoted version")
            os.kill(child.pid, stop)
            child.join(timeout=60)
        finally:
            if child.is_alive():
                child.kill()
                child.join()
    files = view.files()
    assert json.loads(files["latest.json"])["version"] == SECOND
    if stop == signal.SIGTERM:
        assert child.exitcode == 143
        assert "publish stopped by SIGTERM: an unfinished version is withdrawn" in capfd.readouterr().err
        assert sorted(_versions(files)) == [SECOND], "the stopped run's version is withdrawn"
        assert sorted(rel for rel in files if rel.startswith(".")) == [f".claims/{SECOND}", ".latest.json.lock"]
        return
    assert child.exitcode == -signal.SIGKILL
    assert sorted(_versions(files)) == [SECOND, stopped], "SIGKILL leaves the promoted version above latest.json's"
    soon = _publish(view, models["model-2"], 0.80, clock=lambda: stopped + 60)
    assert not soon.published and stopped in _versions(view.files()), "a publish within the hour leaves it"
    later = _publish(view, models["model-3"], 0.91, clock=lambda: stopped + STALE_CLAIM)
    assert later.published and later.version == stopped + STALE_CLAIM
    files = view.files()
    assert sorted(_versions(files)) == [SECOND, stopped + STALE_CLAIM]
    assert sorted(rel for rel in files if rel.startswith(".claims/")) == [
        f".claims/{SECOND}",
        f".claims/{stopped + STALE_CLAIM}",
    ]
    assert not [rel for rel in files if rel.startswith(".staging-")]


# --- GCS: gcsfs against a stand-in of the JSON API -------------------------------------------------------------


class GcsStandIn:
    """The calls gcsfs and `trainer.publishing.conditional` make to GCS's JSON API, with generation preconditions.

    Objects get a new generation on every write. `ifGenerationMatch=0` succeeds only when the object does not
    exist, `ifGenerationMatch=G` only when its generation is G; otherwise 412 conditionNotMet, as GCS answers.
    A GET with `generation=` of a generation that is not the live one is 404. Lists honour `prefix` and
    `delimiter`; rewrites finish in one call; deletes are single (gcsfs sends no batches to an emulator).
    """

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict] = {}
        self.lock = threading.Lock()
        self.generation = 1_000_000
        self.unknown: list[str] = []
        self._served = serve(self, "127.0.0.1", 0)
        self.url = self._served.url

    def env(self) -> dict[str, str]:
        """The environment that points gcsfs here, anonymously, on loopback only."""
        return {
            "STORAGE_EMULATOR_HOST": self.url,
            "FSSPEC_GS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "GCE_METADATA_HOST": "127.0.0.1:9",
            "GCE_METADATA_IP": "127.0.0.1:9",
            "NO_GCE_CHECK": "true",
        }

    def stop(self) -> None:
        self._served.stop()

    def files(self, bucket: str, prefix: str) -> dict[str, bytes]:
        with self.lock:
            return {
                name[len(prefix) :]: obj["data"]
                for (b, name), obj in self.objects.items()
                if b == bucket and name.startswith(prefix)
            }

    def __call__(self, environ, start_response):
        request = Request(environ)
        parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(environ["RAW_URI"]).path.split("/")[1:]]
        with self.lock:
            response = self._answer(request, parts)
        return response(environ, start_response)

    def _answer(self, request: Request, parts: list[str]) -> Response:
        args = request.args
        if parts[:4] == ["upload", "storage", "v1", "b"] and parts[5:] == ["o"] and request.method == "POST":
            return self._upload(request, parts[4])
        if parts[:1] == ["download"]:
            parts = parts[1:]
        if parts[:3] == ["storage", "v1", "b"] and len(parts) >= 5:
            bucket = parts[3]
            if len(parts) == 5 and parts[4] == "o" and request.method == "GET":
                return self._list(bucket, args.get("prefix", ""), args.get("delimiter", ""))
            if len(parts) == 6 and parts[4] == "o":
                key = (bucket, parts[5])
                if request.method == "DELETE":
                    return Response(status=204) if self.objects.pop(key, None) else _error(404, "No such object")
                if request.method == "GET":
                    obj = self.objects.get(key)
                    wanted = args.get("generation")
                    if obj is None or (wanted and wanted != str(obj["generation"])):
                        return _error(404, f"No such object: {bucket}/{parts[5]}")
                    if args.get("alt") == "media":
                        return Response(obj["data"], headers={"x-goog-generation": str(obj["generation"])})
                    return _json(self._resource(key))
            if len(parts) == 11 and parts[4] == "o" and parts[6] == "rewriteTo" and request.method == "POST":
                source = self.objects.get((bucket, parts[5]))
                if source is None:
                    return _error(404, "No such object")
                self._write((parts[8], parts[10]), source["data"])
                resource = self._resource((parts[8], parts[10]))
                return _json({"kind": "storage#rewriteResponse", "done": True, "resource": resource})
        self.unknown.append(f"{request.method} {request.full_path}")
        return _error(400, "not in the stand-in")

    def _upload(self, request: Request, bucket: str) -> Response:
        kind = request.args.get("uploadType")
        if kind == "media":
            name, data = request.args["name"], request.get_data()
        elif kind == "multipart":
            boundary = request.mimetype_params["boundary"].encode()
            sections = [s for s in request.get_data().split(b"--" + boundary) if s.strip(b"-\r\n")]
            meta = json.loads(sections[0].split(b"\n\n", 1)[1])
            name, data = meta["name"], sections[1].split(b"\n\n", 1)[1][:-1]
        else:
            return _error(400, f"uploadType {kind} is not in the stand-in")
        key = (bucket, name)
        condition = request.args.get("ifGenerationMatch")
        if condition is not None:
            live = self.objects.get(key)
            if (live["generation"] if live else 0) != int(condition):
                return _error(412, "At least one of the pre-conditions you specified did not hold.", "conditionNotMet")
        self._write(key, data)
        return _json(self._resource(key))

    def _write(self, key: tuple[str, str], data: bytes) -> None:
        self.generation += 1
        self.objects[key] = {"data": data, "generation": self.generation, "updated": datetime.now(timezone.utc)}

    def _resource(self, key: tuple[str, str]) -> dict:
        obj = self.objects[key]
        stamp = obj["updated"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {
            "kind": "storage#object",
            "bucket": key[0],
            "name": key[1],
            "generation": str(obj["generation"]),
            "metageneration": "1",
            "size": str(len(obj["data"])),
            "md5Hash": base64.b64encode(hashlib.md5(obj["data"]).digest()).decode(),  # noqa: S324
            "contentType": "application/octet-stream",
            "updated": stamp,
            "timeCreated": stamp,
        }

    def _list(self, bucket: str, prefix: str, delimiter: str) -> Response:
        items, prefixes = [], set()
        for b, name in sorted(self.objects):
            if b != bucket or not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
            else:
                items.append(self._resource((b, name)))
        return _json({"kind": "storage#objects", "items": items, "prefixes": sorted(prefixes)})


def _json(body: dict) -> Response:
    return Response(json.dumps(body), content_type="application/json")


def _error(status: int, message: str, reason: str = "") -> Response:
    errors = [{"message": message, "reason": reason or "error"}]
    return Response(json.dumps({"error": {"code": status, "message": message, "errors": errors}}), status=status)


@pytest.fixture
def gcs():
    server = GcsStandIn()
    yield server
    server.stop()


def test_four_runs_publishing_to_one_gcs_prefix_at_once_end_with_the_best_named(models, gcs):
    """Through gcsfs against the JSON-API stand-in: claims with ifGenerationMatch=0, latest.json with its generation."""
    view = GcsView(gcs)
    chosen = dict(list(models.items())[:4])
    results = run_concurrently(view, chosen, ACCURACIES[:4], "accuracy", True)
    assert gcs.unknown == []
    published = check_end_state(view, results, "accuracy", True)
    assert all(v >= SECOND for v in published)
    print("gcs:", _report(results))


def test_latest_json_replaced_under_every_try_ends_142_with_one_line_and_nothing_left(
    tmp_path, models, monkeypatch, capsys
):
    """With one try allowed, another run's publish between A's read and A's replace is one too many for A."""
    from trainer.core.entry import run_step

    monkeypatch.setattr("trainer.publishing.publish.ATTEMPTS", 1)
    view = PathView(tmp_path)
    calls = []

    def clock():
        calls.append(1)
        if len(calls) == 2:
            assert _publish(view, models["model-1"], 0.50).version == SECOND
        return SECOND

    with pytest.raises(SystemExit) as exit_info:
        run_step(
            publish,
            saved_model_dir=models["model-0"],
            metrics={"accuracy": 0.9},
            publish_uri=view.uri,
            lineage={"run_id": "model-0"},
            clock=clock,
        )
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 142 and errors == [
        f"error: {view.uri}/latest.json: other runs replaced it before each of this run's tries to replace it (1); "
        "the step ends with 142 (a store fault that a later run or a KFP retry of the run may not meet)"
    ]
    files = view.files()
    assert sorted(_versions(files)) == [SECOND], "A's version and claim are withdrawn"
    assert sorted(rel for rel in files if rel.startswith(".")) == [f".claims/{SECOND}", ".latest.json.lock"]
    assert json.loads(files["latest.json"])["lineage"]["run_id"] == "model-1"
