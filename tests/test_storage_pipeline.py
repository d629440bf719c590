"""Storage on a cluster: the checkpoint volume (ReadWriteMany only) and what the compiled YAML carries."""

import pytest
import yaml
from kfp.dsl import Artifact, Dataset, Model

import components
from pipelines.cli import compile_pipeline
from pipelines.storage import StorageSettings
from tests.standins.kube import KubeStandIn, write_kubeconfig
from tests.support.pipelines import IMAGE
from trainer.cluster.resume import home_for
from trainer.config.contract import RuntimeConfig, TrainConfig
from trainer.core.errors import UsageError
from trainer.k8s import checkpoints, objects

NS = "team-a"
RUN_ID = "run-42"


@pytest.fixture
def api(httpserver, monkeypatch, tmp_path):
    standin = KubeStandIn()
    standin.install(httpserver)
    for name, modes in (("shared", ["ReadWriteMany"]), ("single", ["ReadWriteOnce"])):
        standin.add("persistentvolumeclaims", NS, {"metadata": {"name": name}, "spec": {"accessModes": modes}})
    monkeypatch.setenv("POD_NAMESPACE", NS)
    url = httpserver.url_for("").rstrip("/")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return objects.core_api(host=url)


def test_a_read_write_once_claim_is_refused_with_the_reason(api):
    checkpoints.check_claim("shared", api)
    with pytest.raises(
        UsageError, match=r"^checkpoint_claim 'single' is ReadWriteOnce; allowed: a ReadWriteMany claim.*deadlocks"
    ):
        checkpoints.check_claim("single", api)
    with pytest.raises(UsageError, match=r"^checkpoint_claim 'nope' does not exist in namespace 'team-a'"):
        checkpoints.check_claim("nope", api)


TWO_WORKERS_1 = {"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 1}}


def test_workers_checkpoint_on_the_mounted_claim_per_run(api, tmp_path, monkeypatch):
    config = TrainConfig(RuntimeConfig(data_dir="d", model_dir="m", run_id=RUN_ID, checkpoint_claim="shared"))
    monkeypatch.setattr(checkpoints, "MOUNT", str(tmp_path / "absent"))
    with pytest.raises(UsageError, match="nothing is mounted at .*compile the pipeline with --checkpoint-volume"):
        checkpoints.on_claim(config, api)
    monkeypatch.setattr(checkpoints, "MOUNT", str(tmp_path))
    on_claim = checkpoints.on_claim(config, api)
    assert on_claim.runtime.checkpoint_dir == str(tmp_path)
    assert home_for(on_claim, TWO_WORKERS_1).uri == f"{tmp_path}/{objects.run_key(RUN_ID)}/worker-1"
    chosen = checkpoints.on_claim(config.replace(checkpoint_dir=f"{tmp_path}/mine"), api)
    assert chosen.runtime.checkpoint_dir == f"{tmp_path}/mine"
    assert home_for(chosen, TWO_WORKERS_1).uri == f"{tmp_path}/mine/{objects.run_key(RUN_ID)}/worker-1", "keyed too"
    assert checkpoints.on_claim(config.replace(checkpoint_claim=""), api).runtime.checkpoint_dir == ""


def test_the_worker_step_refuses_a_read_write_once_claim_before_it_joins(api, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(checkpoints, "MOUNT", str(tmp_path))
    op = components.build(IMAGE).train_worker
    with pytest.raises(SystemExit) as exit_info:
        op.python_func(
            dataset=Dataset(uri=str(tmp_path / "data")),
            cluster=Artifact(uri=str(tmp_path / "cluster")),
            worker_index=0,
            model=Model(uri=str(tmp_path / "model")),
            run_id=RUN_ID,
            checkpoint_claim="single",
            cluster_mode="kubernetes",
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-3000:]
    assert (
        [line for line in err.splitlines() if line.startswith("error:")]
        == [line for line in err.splitlines() if line.startswith("error: checkpoint_claim 'single' is ReadWriteOnce")]
        != []
    )
    assert not (tmp_path / "model").exists()


def _compiled(tmp_path, strategy="multi_worker_mirrored", **storage):
    path = tmp_path / f"{strategy}.yaml"
    compile_pipeline(str(path), IMAGE, strategy, storage=StorageSettings(**storage))
    docs = list(yaml.safe_load_all(path.read_text()))
    executors = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if len(docs) > 1 else {}
    return docs[0], executors


# The steps that store, and those that read the dataset where data_uri put it (prepare writes it).
STORING = {"exec-publish-model", "exec-deploy-model", "exec-prepare-data", "exec-evaluate"}
PS_TASKS = {"exec-train-chief", "exec-train-server"}


def _secret_env(executor):
    secret = executor["secretAsEnv"][0]
    return secret["secretName"], {(k["secretKey"], k["envVar"]) for k in secret["keyToEnv"]}


def test_the_yaml_carries_the_secret_environment_and_when_asked_the_volume(tmp_path):
    spec, executors = _compiled(tmp_path, storage_secret="s3-creds", checkpoint_volume="shared")
    for name in STORING | {"exec-train-worker"}:
        assert _secret_env(executors[name]) == (
            "s3-creds",
            {("accesskey", "AWS_ACCESS_KEY_ID"), ("secretkey", "AWS_SECRET_ACCESS_KEY")},
        )
    mount = executors["exec-train-worker"]["pvcMount"][0]
    assert mount["mountPath"] == "/mnt/checkpoints"
    assert mount["pvcNameParameter"]["componentInputParameter"].endswith("checkpoint_claim")
    assert spec["root"]["inputDefinitions"]["parameters"]["checkpoint_claim"]["defaultValue"] == "shared"
    assert not any("secretAsEnv" in e for name, e in executors.items() if name not in STORING | {"exec-train-worker"})

    (tmp_path / "plain").mkdir()
    plain, plain_executors = _compiled(tmp_path / "plain")
    assert not any("secretAsEnv" in e or "pvcMount" in e for e in plain_executors.values())
    parameters = plain["root"]["inputDefinitions"]["parameters"]
    assert parameters["checkpoint_claim"]["defaultValue"] == ""
    assert parameters["s3_endpoint"]["defaultValue"] == parameters["storage"]["defaultValue"] == ""


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "parameter_server"])
def test_storage_kfp_is_one_setting_for_every_step_that_stores(tmp_path, strategy):
    spec, executors = _compiled(tmp_path, strategy, storage="kfp")
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    assert parameters["storage"]["defaultValue"] == "kfp"
    assert parameters["publish_uri"]["defaultValue"] == "s3://mlpipeline/private/{namespace}/models/mnist"
    streams = "s3://mlpipeline/private-artifacts/{namespace}/datasets" if strategy == "multi_worker_mirrored" else ""
    assert parameters["data_uri"]["defaultValue"] == streams, "parameter-server workers cannot read s3://"
    storing = STORING | (PS_TASKS if strategy == "parameter_server" else {"exec-train-worker"})
    assert {name for name, e in executors.items() if "secretAsEnv" in e} == storing
    for name in storing:
        assert _secret_env(executors[name]) == (
            "mlpipeline-minio-artifact",
            {("accesskey", "AWS_ACCESS_KEY_ID"), ("secretkey", "AWS_SECRET_ACCESS_KEY")},
        )
    assert {e["fieldPath"] for e in executors["exec-publish-model"]["fieldPathAsEnv"]} == {"metadata.namespace"}
    components = spec["components"]
    for name in ("comp-publish-model", "comp-deploy-model", *(("comp-train-chief",) if PS_TASKS & storing else ())):
        assert {"storage", "s3_endpoint"} <= set(components[name]["inputDefinitions"]["parameters"]), name


def test_storage_kfp_and_another_secret_are_one_too_many():
    with pytest.raises(UsageError, match="storage_secret 's3-creds' is not allowed with storage 'kfp'"):
        StorageSettings(storage="kfp", storage_secret="s3-creds")


def test_the_parameter_server_pipeline_needs_no_status_location(tmp_path):
    spec, _ = _compiled(
        tmp_path, "parameter_server", storage_secret="s3-creds", storage_secret_keys="id=AWS_ACCESS_KEY_ID"
    )
    status_uri = spec["root"]["inputDefinitions"]["parameters"]["status_uri"]
    assert status_uri["defaultValue"] == "" and status_uri["isOptional"] is True
    assert "ConfigMap of the run in kubernetes mode" in status_uri["description"]
