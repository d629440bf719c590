"""`storage=kfp`: Kubeflow Pipelines' own object store, as a namespace of multi-user KFP 2.17 sees it.

moto's S3 server (IAM enforced) holds the bucket `mlpipeline`, and namespace `team-a` gets keys under the policy KFP's
profile controller writes for it (`tests.standins.s3.profile_policy`). The steps run as in a pod of that namespace:
POD_NAMESPACE set, the keys of the Secret `mlpipeline-minio-artifact` as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY.
The endpoint is the server's (a run uses http://seaweedfs.kubeflow:9000 unless s3_endpoint says otherwise).
"""

import json
import re
import time

import pytest

from tests.standins.s3 import S3Server
from tests.support.records import write_history
from trainer import steps
from trainer.config.contract import TrainConfig
from trainer.core.entry import run_step
from trainer.core.runs import run_key
from trainer.storage import kfpstore
from trainer.training import parameter_server as ps

pytestmark = pytest.mark.slow  # a server process and a SavedModel

NAMESPACE = "team-a"
PREFIXES = (
    "s3://mlpipeline/artifacts/, s3://mlpipeline/private-artifacts/team-a/, s3://mlpipeline/private/team-a/, "
    "s3://mlpipeline/shared/"
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"), kfp_namespaces=(NAMESPACE, "team-b"))
    yield server
    server.stop()


@pytest.fixture
def pod(store, monkeypatch):
    """This process as a pod of namespace team-a with its namespace's keys."""
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    for name, value in store.namespace_keys[NAMESPACE].env().items():
        monkeypatch.setenv(name, value)
    return store


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model directory as the evaluate step passes it on: a small SavedModel and the chief's history.json."""
    import tensorflow as tf

    root = tmp_path_factory.mktemp("chief")
    module = tf.Module()
    module.scale = tf.Variable(2.0)
    module.serve = tf.function(lambda x: {"y": x * module.scale}, input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(root / "saved_model"), signatures={"serving_default": module.serve})
    write_history(root)
    return str(root)


def _publish(model_dir, store, publish_uri, storage="kfp"):
    return steps.publish_model(
        model_dir, {"accuracy": 0.98}, publish_uri, s3_endpoint=store.url, storage=storage, model_uri="m"
    )


def test_the_default_location_is_the_namespaces_own_prefix_and_publishing_there_works(pod, model_dir):
    assert kfpstore.PUBLISH_URI == "s3://mlpipeline/private/{namespace}/models/mnist"
    result = _publish(model_dir, pod, kfpstore.PUBLISH_URI)
    assert result.published, result
    assert result.path == f"s3://mlpipeline/private/{NAMESPACE}/models/mnist/{result.version}"
    keys = pod.keys(f"private/{NAMESPACE}/models/mnist/", bucket="mlpipeline")
    assert f"private/{NAMESPACE}/models/mnist/latest.json" in keys
    assert f"private/{NAMESPACE}/models/mnist/{result.version}/saved_model.pb" in keys
    shared = _publish(model_dir, pod, "s3://mlpipeline/shared/models/mnist")
    assert shared.published, "shared/ is every namespace's"


@pytest.mark.parametrize(
    "publish_uri",
    ["s3://mlpipeline/models/mnist", "s3://mlpipeline/private/team-b/models/mnist"],
    ids=["outside every namespace's prefixes", "another namespace's prefix"],
)
def test_outside_its_prefixes_one_line_names_where_the_keys_may_write_and_nothing_is_left(
    pod, model_dir, publish_uri, capsys
):
    before = pod.keys(bucket="mlpipeline")
    with pytest.raises(SystemExit) as exit_info:
        run_step(_publish, model_dir=model_dir, store=pod, publish_uri=publish_uri)
    assert exit_info.value.code == 4, "denied"
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert re.match(r"error: s3://mlpipeline at http://127\.0\.0\.1:\d+ refused to \w+ '", errors[0]), errors[0]
    assert errors[0].endswith(
        f"the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) are the keys KFP gives namespace "
        f"'{NAMESPACE}' (storage=kfp), which may read and write only under {PREFIXES}"
    ), errors[0]
    assert pod.keys(bucket="mlpipeline") == before, "no half-written version"


def test_storage_kfp_without_the_namespaces_keys_is_bad_input(store, model_dir, monkeypatch, capsys):
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        run_step(_publish, model_dir=model_dir, store=store, publish_uri=kfpstore.PUBLISH_URI)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: storage 'kfp' needs the keys of the Secret mlpipeline-minio-artifact as AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY; allowed: a pipeline compiled with --storage kfp (which gives them to the pods that "
        "store), or storage ''"
    )


def test_a_location_naming_the_namespace_outside_a_pod_is_refused(store, model_dir, monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(Exception, match=r"location 's3://mlpipeline/private/\{namespace\}/models/mnist' names"):
        _publish(model_dir, store, kfpstore.PUBLISH_URI, storage="")


def test_the_parameter_server_status_goes_to_the_same_store_with_the_same_keys(pod, tmp_path):
    config = TrainConfig.from_settings(
        data_dir=str(tmp_path),
        model_dir=str(tmp_path / "model"),
        run_id="run-1",
        strategy="parameter_server",
        status_uri="s3://mlpipeline/private/{namespace}/status/run-1.json",
        storage="kfp",
        s3_endpoint=pod.url,
    )
    with ps.StatusPublisher(ps.status_store(config)):
        key = f"private/{NAMESPACE}/status/{run_key('run-1')}/run-1.json"
        status = json.loads(pod.read_from("mlpipeline", key))
        assert status["state"] == "running" and time.time() - status["heartbeat"] < 60
    ps.wait_for_chief(ps.status_store(config), 5, 30, "ps 0")
    refused = TrainConfig.from_settings(
        data_dir=str(tmp_path),
        model_dir=str(tmp_path / "model"),
        run_id="run-1",
        strategy="parameter_server",
        status_uri="s3://mlpipeline/status/run-1.json",
        storage="kfp",
        s3_endpoint=pod.url,
    )
    with pytest.raises(Exception, match=re.escape(f"may read and write only under {PREFIXES}")):
        ps.StatusPublisher(ps.status_store(refused)).__enter__()
