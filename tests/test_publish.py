"""Publishing through the real storage clients: a local path and a real S3 server (moto_server on 127.0.0.1).

Every behaviour is checked the same way on both: versions, metrics.json, latest.json, a worse model refused, a
failure in the middle of a copy leaving nothing visible. The S3 cases go through s3fs over HTTP with IAM enforced,
so wrong or too weak credentials are refused by the server, not by the test.
"""

import json
import os
import re
import shutil
import uuid

import pytest

from tests.standins.s3 import BUCKET, FaultyProxy, S3Server
from tests.support.records import write_history
from trainer.core import faults
from trainer.core.errors import StoreUnavailableError, UsageError
from trainer.publishing.publish import latest, publish

pytestmark = pytest.mark.slow  # each test starts a server or a fresh TensorFlow process

LINEAGE = {"run_id": "run-1", "dataset": "sample", "model_uri": "minio://x", "parameters": {"epochs": 2}}


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A small real SavedModel (a serving function over one variable), as the trainer exports it."""
    import tensorflow as tf

    class Doubler(tf.Module):
        def __init__(self):
            super().__init__()
            self.scale = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def serve(self, x):
            return {"y": x * self.scale}

    module = Doubler()
    path = tmp_path_factory.mktemp("model") / "saved_model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return str(path)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


class Backend:
    """One place to publish to, and how to look at it from outside the code under test."""

    def __init__(self, kind, tmp_path, s3=None):
        self.kind, self.s3 = kind, s3
        prefix = f"mnist-{uuid.uuid4().hex[:6]}"
        self.prefix = prefix
        self.uri = f"s3://{BUCKET}/{prefix}" if kind == "s3" else str(tmp_path / prefix)
        self.endpoint = s3.url if kind == "s3" else ""

    def listing(self):
        """Every file under the location, relative to it."""
        if self.kind == "s3":
            return [k[len(self.prefix) + 1 :] for k in self.s3.keys(self.prefix + "/")]
        return sorted(
            os.path.relpath(os.path.join(root, f), self.uri) for root, _, files in os.walk(self.uri) for f in files
        )

    def read_json(self, rel):
        data = self.s3.read(f"{self.prefix}/{rel}") if self.kind == "s3" else open(f"{self.uri}/{rel}", "rb").read()
        return json.loads(data)

    def publish(self, saved_model, accuracy):
        return publish(saved_model, {"accuracy": accuracy, "loss": 0.1}, self.uri, LINEAGE, self.endpoint)


@pytest.fixture(params=["path", "s3"])
def backend(request, tmp_path, monkeypatch):
    if request.param == "s3":
        server = request.getfixturevalue("s3")
        for name, value in server.publisher.env().items():
            monkeypatch.setenv(name, value)
        return Backend("s3", tmp_path, server)
    return Backend("path", tmp_path)


def _model_files(saved_model):
    return sorted(
        os.path.relpath(os.path.join(root, f), saved_model) for root, _, files in os.walk(saved_model) for f in files
    )


def _one_version(backend, saved_model, version):
    """What a location holds after one publish: the version, its metrics, its claim and latest.json.

    On a path also the lock file that serialises replacing latest.json (`trainer.publishing.conditional`).
    """
    lock = [".latest.json.lock"] if backend.kind == "path" else []
    files = [f"{version}/{f}" for f in [*_model_files(saved_model), "metrics.json"]]
    return sorted([*files, "latest.json", f".claims/{version}", *lock])


def test_first_publish_writes_a_complete_version_its_metrics_and_latest(backend, saved_model):
    result = backend.publish(saved_model, 0.96)
    version = result.version
    assert result.published and result.reason.endswith("(first version)")
    assert backend.listing() == _one_version(backend, saved_model, version), "no staging copy or probe left"
    latest_doc = backend.read_json("latest.json")
    assert latest_doc == backend.read_json(f"{version}/metrics.json")
    assert latest_doc["version"] == version and latest_doc["path"] == f"{backend.uri}/{version}"
    assert latest_doc["metrics"]["accuracy"] == 0.96 and latest_doc["lineage"] == LINEAGE
    assert latest(backend.uri, backend.endpoint).to_json() == latest_doc
    if backend.kind == "s3":
        source = open(os.path.join(saved_model, "variables", "variables.data-00000-of-00001"), "rb").read()
        assert backend.s3.read(f"{backend.prefix}/{version}/variables/variables.data-00000-of-00001") == source


def test_a_better_model_gets_a_higher_version_and_a_worse_one_replaces_nothing(backend, saved_model):
    first = backend.publish(saved_model, 0.96).version
    second = backend.publish(saved_model, 0.97)
    assert second.published and second.version > first and second.reason.endswith("(previous 0.9600)")
    before = backend.listing()
    third = backend.publish(saved_model, 0.95)
    assert not third.published
    assert third.reason == (f"not published: accuracy 0.9500 is below the published version {second.version} (0.9700)")
    assert backend.listing() == before
    assert backend.read_json("latest.json")["version"] == second.version


def test_a_model_without_an_accuracy_is_published_as_the_newest(tmp_path, saved_model):
    """A command-mode model whose command reported no accuracy: every successful run is the newest version."""
    uri = str(tmp_path / "published")
    lineage = {"run_id": "r", "command": ["python", "train.py"], "image": "i", "task": "worker:0"}
    first = publish(saved_model, {"accuracy": 0.99}, uri, lineage)
    second = publish(saved_model, {}, uri, lineage)
    assert second.published and second.version > first.version
    assert second.reason == (
        f"published version {second.version} (no accuracy to compare: the newest successful run is published)"
    )
    third = publish(saved_model, {"accuracy": 0.5}, uri, lineage)
    assert third.published
    assert (
        third.reason
        == f"published version {third.version} with accuracy 0.5000 (previous version {second.version} has no accuracy)"
    )
    assert latest(uri).version == third.version and latest(uri).accuracy == 0.5 and latest(uri).lineage == lineage


def test_a_source_file_lost_mid_copy_leaves_nothing_visible(backend, saved_model, tmp_path):
    backend.publish(saved_model, 0.96)
    before = backend.listing()
    broken = tmp_path / "broken"
    shutil.copytree(saved_model, broken)
    os.symlink(tmp_path / "gone", broken / "variables" / "zz-lost")  # listed, then unreadable when copied
    with pytest.raises(FileNotFoundError):
        backend.publish(str(broken), 0.99)
    assert backend.listing() == before, "no staging, no version, latest.json unchanged"


def test_s3_a_connection_lost_while_the_version_is_copied_leaves_no_version(s3, saved_model, tmp_path, monkeypatch):
    """The staged upload succeeds; the server-side copy into the version fails half-way (after the variables).

    The store answers 500 InternalError to that copy every time: transient, so it is retried (5 attempts, the
    schedule shortened here), then the store is unavailable (exit 142).
    """
    monkeypatch.setattr(faults, "FIRST_DELAY", 0.01)
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    target = Backend("s3", tmp_path, s3)
    first = target.publish(saved_model, 0.96).version

    def fails(request):
        copying = request.method == "PUT" and "x-amz-copy-source" in request.headers
        return copying and request.path.endswith("/variables/variables.index")

    proxy = FaultyProxy(s3.url, fails)
    try:
        with pytest.raises(
            StoreUnavailableError,
            match=rf"^s3://{BUCKET} at {proxy.url}: write '{BUCKET}/{target.prefix}/\d+/\S+': the store stayed "
            r"throttled or unavailable through 5 attempts in \d+\.\d s \(last: 500 InternalError: injected: "
            r"connection lost\)",
        ):
            publish(saved_model, {"accuracy": 0.99}, target.uri, LINEAGE, proxy.url)
    finally:
        proxy.stop()
    copies = [path for method, path, _ in proxy.requests if method == "PUT" and "/.staging-" not in path]
    assert copies and not any("saved_model.pb" in p for p in copies), "saved_model.pb is copied last: never here"
    assert sum(failed for *_, failed in proxy.requests) == 5, "one request per attempt"
    assert target.listing() == _one_version(target, saved_model, first), "the unfinished version and its claim gone"
    assert target.read_json("latest.json")["version"] == first


@pytest.mark.parametrize(
    ("who", "message"),
    [
        (
            "stranger",
            r"refused to read '{bucket}/{prefix}/latest.json': (the access key is not known to this server "
            r"\(InvalidAccessKeyId\)|access denied \(an unknown access key, .*\) \(403\)); the credentials "
            r"\(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY\) need s3:GetObject on bucket '{bucket}'",
        ),
        (
            "reader",
            r"refused to write '{bucket}/{prefix}/\.staging-\d+-\w+/\S+': access denied \(AccessDenied\); the "
            r"credentials \(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY\) need s3:PutObject on bucket '{bucket}'",
        ),
    ],
)
def test_s3_weak_or_wrong_credentials_give_one_line_naming_bucket_and_permission(
    s3, saved_model, tmp_path, monkeypatch, capsys, who, message
):
    """Through the component body, credentials from the environment as a Secret gives them: exit 4, one line."""
    import components

    keys = {"reader": s3.reader.env(), "stranger": {"AWS_ACCESS_KEY_ID": "AKIA0000", "AWS_SECRET_ACCESS_KEY": "x"}}
    for name, value in keys[who].items():
        monkeypatch.setenv(name, value)
    target = Backend("s3", tmp_path, s3)
    model = _chief_model(tmp_path, saved_model)
    from kfp.dsl import Markdown, Metrics

    metrics = Metrics(uri=str(tmp_path / "metrics"))
    metrics.metadata.update({"accuracy": 0.97})
    with pytest.raises(SystemExit) as exit_info:
        components.build("registry.example.com/x:1").publish_model.python_func(
            model=model,
            metrics=metrics,
            decision=Markdown(uri=str(tmp_path / "decision")),
            publish_uri=target.uri,
            s3_endpoint=s3.url,
        )
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 4 and len(errors) == 1, err[-3000:]
    assert "Traceback" not in err
    expected = message.format(bucket=BUCKET, prefix=target.prefix)
    assert errors[0].startswith(f"error: s3://{BUCKET} at {s3.url} refused to"), errors[0]
    assert re.search(expected, errors[0]), errors[0]
    assert target.listing() == [], "nothing half-written"


def test_s3_a_bucket_that_does_not_exist_is_bad_input(s3, saved_model, monkeypatch):
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=rf"bucket 'nope' of s3://nope/m does not exist at {s3.url}"):
        publish(saved_model, {"accuracy": 0.99}, "s3://nope/m", LINEAGE, s3.url)


def _chief_model(tmp_path, saved_model):
    """A chief Model artifact as the evaluate step hands it on: saved_model/ and history.json."""
    from kfp.dsl import Model

    root = tmp_path / "chief"
    shutil.copytree(saved_model, root / "saved_model")
    write_history(root)
    return Model(uri=str(root))
