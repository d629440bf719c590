"""TFJob semantics as pure functions, the manifest reader's refusals, and the compiled pipeline of a TFJob."""

import copy
import os
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.processes import run_module
from trainer.cluster.topology import assign_addresses
from trainer.command import run, tfjob_spec
from trainer.command.tfjob_spec import EnvSource, JobSpec, Mount, Replica, read_manifest
from trainer.core.errors import UsageError

EXAMPLE = ROOT / "pipelines" / "tfjob_example" / "tfjob.yaml"
IMAGE = "registry.example.com/team/kfp-tf-multiworker:0.1.0"
SECRET = "0" * 64


def _example():
    return yaml.safe_load(EXAMPLE.read_text())


def _operators_tf_config(cluster, task_type, index):
    """TF_CONFIG as a command-mode task gets it: the one builder, placed as TFJob's operator placed a task."""
    from trainer.cluster.cluster_record import ClusterRecord
    from trainer.cluster.lifecycle import Member, Placement

    placement = Placement(
        "",
        task_type,
        index,
        "run-1",
        "local",
        60,
        60,
        environment=tfjob_spec.TF_CONFIG_ENVIRONMENT,
        alone_undistributed=True,
    )
    return Member.of_record(ClusterRecord(cluster, {}, "local"), placement).tf_config


def test_tf_config_is_the_operators_with_the_environment_key():
    cluster = {"chief": ["j-chief-0:2222"], "worker": ["j-worker-0:2222", "j-worker-1:2222"]}
    assert _operators_tf_config(cluster, "worker", 1) == {
        "cluster": {"chief": ["j-chief-0:2222"], "worker": ["j-worker-0:2222", "j-worker-1:2222"]},
        "task": {"type": "worker", "index": 1},
        "environment": "cloud",
    }
    assert assign_addresses(["a:1", "b:1", "c:1"], 2, chief=True) == {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert assign_addresses(["a:1", "b:1"], 2) == {"worker": ["a:1", "b:1"]}
    with pytest.raises(UsageError, match="task index 2 is out of range for 'worker'; allowed: 0 to 1"):
        _operators_tf_config(cluster, "worker", 2)


def test_commands_expand_variables_as_kubernetes_does():
    env = {"MODEL_DIR": "/m", "A": "x"}
    assert tfjob_spec.expand("--out=$(MODEL_DIR)/saved", env) == "--out=/m/saved"
    assert tfjob_spec.expand("$$(A) $(A)$(A) $(UNSET) $A", env) == "$(A) xx $(UNSET) $A"


def test_restart_policies_retry_what_the_operator_retried():
    never, on_failure, exit_code = (tfjob_spec.restart_policy(p).retries for p in ("Never", "OnFailure", "ExitCode"))
    codes = [0, 1, 2, 126, 127, 128, 130, 137, 138, 139, 140, 143]
    assert [c for c in codes if never(c)] == []
    assert [c for c in codes if on_failure(c)] == [1, 2, 126, 127, 128, 130, 137, 138, 139, 140, 143]
    # kubeflow/trainer v1.7-v1.9 pkg/util/train/train_util.go IsRetryableExitCode: exitCode >= 128.
    assert [c for c in codes if exit_code(c)] == [128, 130, 137, 138, 139, 140, 143]
    with pytest.raises(UsageError, match="'Sometimes' is not one of Never, OnFailure, ExitCode, Always"):
        tfjob_spec.restart_policy("Sometimes")


def test_the_example_manifest_reads_into_its_job():
    job = read_manifest(_example())
    assert job == JobSpec(
        name="multi-worker",
        namespace="kubeflow-user-example-com",
        replicas=(
            Replica(
                type="worker",
                count=2,
                image=IMAGE,
                command=("python", "/app/pipelines/tfjob_example/train.py"),
                args=(
                    "--data_dir=/app/data/mnist-sample",
                    "--saved_model_dir=/train/saved_model",
                    "--checkpoint_dir=/train/checkpoint",
                    "--metrics_file=$(MODEL_DIR)/metrics.json",
                    "--epochs=5",
                ),
                env=(),
                env_from=(),
                requests=(),
                limits=(("cpu", "2"), ("memory", "4Gi")),
                mounts=(Mount("strat-volume", "/train"),),
                restart_policy="OnFailure",
                port=2222,
            ),
        ),
        warnings=(
            "metadata.namespace (kubeflow-user-example-com): the run's tasks run in the namespace the run is created "
            "in",
            "spec.runPolicy.cleanPodPolicy ('None'): every task deletes its own Service when its step ends and KFP "
            "keeps or deletes pods by its own settings (the Workflow's pod GC); not applied",
        ),
    )


def _unmappable():
    manifest = _example()
    spec = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["nodeSelector"] = {"pool": "gpu"}
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/data"}})
    spec["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    spec["affinity"] = {"podAntiAffinity": {}}
    container = spec["containers"][0]
    container["env"] = [
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
        {"name": "TF_CONFIG", "value": "{}"},
    ]
    container["resources"]["limits"]["example.com/fpga"] = 1
    spec["containers"].append({"name": "logger", "image": "fluentbit"})
    manifest["spec"]["tfReplicaSpecs"]["PS"] = {
        "template": {"spec": {"containers": [{"name": "tensorflow", "image": "ps", "command": ["python"]}]}}
    }
    manifest["spec"]["tfReplicaSpecs"]["Evaluator"] = {"replicas": 2}
    return manifest


def test_every_field_that_cannot_be_carried_over_is_named_in_one_refusal():
    with pytest.raises(UsageError) as refused:
        read_manifest(_unmappable())
    message = str(refused.value)
    assert message.startswith("TFJob multi-worker: 9 field(s) cannot be carried over: ")
    for field in (
        "spec.tfReplicaSpecs.Worker.template.spec.initContainers: an init container cannot be added to a KFP task",
        "spec.tfReplicaSpecs.Worker.template.spec.affinity.podAntiAffinity: kfp-kubernetes 2.17 sets node affinity "
        "only",
        "spec.tfReplicaSpecs.Worker.template.spec.volumes[1] (host): a hostPath volume cannot be mounted",
        "containers[0].env[2].valueFrom (MEM): ['resourceFieldRef'] cannot be set on a KFP task",
        "containers[0].env[3] (TF_CONFIG): TF_CONFIG is generated",
        "resources.limits.example.com/fpga: kfp-kubernetes 2.17 cannot set it on a task",
        "containers (logger): a KFP task runs one container",
        "spec.tfReplicaSpecs.PS: parameter-server training needs a Chief (the coordinator that runs your training "
        "loop) and Workers; the job has PS, Worker",
        "spec.tfReplicaSpecs.Evaluator.replicas: 2; allowed: 1",
    ):
        assert field in message, field
    assert "template.spec.nodeSelector" not in message
    assert "\n" not in message


def test_a_secret_variable_and_a_chief_are_carried_over():
    manifest = _example()
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    worker["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}
    ]
    manifest["spec"]["tfReplicaSpecs"] = {"Chief": {**copy.deepcopy(worker), "replicas": 1}, "Worker": worker}
    job = read_manifest(manifest)
    assert [(r.type, r.count) for r in job.replicas] == [("chief", 1), ("worker", 2)]
    assert job.replica("chief").env_from == (EnvSource("TOKEN", "secret", "creds", "token"),)


def test_the_task_environment_names_where_to_write_and_fits_the_cpu():
    env = run.task_environment(
        {"PATH": "/bin", "TF_NUM_INTRAOP_THREADS": "3"},
        {"OUT": "$(MODEL_DIR)/x", "AFTER": "$(OUT)/y", "TF_USE_LEGACY_KERAS": "0"},
        "/model",
        "/ckpt",
    )
    assert env == {
        "PATH": "/bin",
        "MODEL_DIR": "/model",
        "CHECKPOINT_DIR": "/ckpt",
        "OUT": "/model/x",
        "AFTER": "/model/x/y",
        "TF_USE_LEGACY_KERAS": "0",
        "TF_NUM_INTRAOP_THREADS": "3",
        "TF_NUM_INTEROP_THREADS": "2",
        "PYTHONUNBUFFERED": "1",
    }
    assert run.task_environment({}, {}, "/m", "/c")["TF_USE_LEGACY_KERAS"] == "1"


def test_a_local_run_maps_container_paths_and_claims_to_this_machine(tmp_path):
    from pipelines.tfjob import for_this_machine, local_paths

    job = read_manifest(_example())
    paths = local_paths(job, {"/app": "/repo"}, str(tmp_path / "volumes"))
    assert paths == {"/app": "/repo", "/train": str(tmp_path / "volumes" / "strat-volume")}
    job = for_this_machine(job, paths)
    worker = job.replica("worker")
    assert worker.command == (sys.executable, "/repo/pipelines/tfjob_example/train.py")
    volume = tmp_path / "volumes" / "strat-volume"
    assert worker.args[:3] == (
        "--data_dir=/repo/data/mnist-sample",
        f"--saved_model_dir={volume}/saved_model",
        f"--checkpoint_dir={volume}/checkpoint",
    )
    assert volume.is_dir() and worker.mounts == ()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("tfjob") / "job.yaml"
    result = run_module(
        "pipelines.tfjob",
        str(EXAMPLE),
        "--compile",
        "--image",
        IMAGE,
        "--saved-model",
        "/train/saved_model",
        "--output",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result, list(yaml.safe_load_all(out.read_text()))


def test_the_compiled_job_runs_each_worker_in_its_image_with_its_claim_and_limits(compiled):
    result, (spec, platform) = compiled
    assert "warning: spec.runPolicy.cleanPodPolicy ('None')" in result.stderr
    assert spec["pipelineInfo"]["name"] == "tfjob-multi-worker"
    executor = spec["deploymentSpec"]["executors"]["exec-run-command"]["container"]
    assert executor["image"] == IMAGE
    # limits as written, and no request the manifest did not give
    assert executor["resources"] == {
        "cpuLimit": 2.0,
        "memoryLimit": 4.294967296,
        "resourceCpuLimit": "2",
        "resourceMemoryLimit": "4Gi",
    }
    pod = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-run-command"]
    assert pod["pvcMount"] == [
        {
            "constant": "strat-volume",
            "mountPath": "/train",
            "pvcNameParameter": {"runtimeValue": {"constant": "strat-volume"}},
        }
    ]
    assert pod["podMetadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["port"]["defaultValue"] == 2222 and inputs["max_restarts"]["defaultValue"] == 2
    loop = spec["root"]["dag"]["tasks"]["for-loop-1"]["componentRef"]["name"]
    task = spec["components"][loop]["dag"]["tasks"]["run-command"]["inputs"]["parameters"]
    assert task["command"]["runtimeValue"]["constant"] == [
        "python",
        "/app/pipelines/tfjob_example/train.py",
        "--data_dir=/app/data/mnist-sample",
        "--saved_model_dir=/train/saved_model",
        "--checkpoint_dir=/train/checkpoint",
        "--metrics_file=$(MODEL_DIR)/metrics.json",
        "--epochs=5",
    ]
    assert task["saved_model"]["runtimeValue"]["constant"] == "/train/saved_model"


def test_a_manifest_with_unmappable_fields_is_refused_with_one_line_and_nothing_written(tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(yaml.safe_dump(_unmappable()))
    out = tmp_path / "job.yaml"
    result = run_module(
        "pipelines.tfjob", str(manifest), "--compile", "--image", IMAGE, "--output", str(out), timeout=120
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "9 field(s) cannot be carried over" in errors[0]
    assert not out.exists() and not Path(str(out) + ".tmp").exists()
    assert os.listdir(tmp_path) == ["bad.yaml"]


def _chief_and_workers():
    manifest = _example()
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    manifest["spec"]["tfReplicaSpecs"] = {"Chief": {**copy.deepcopy(worker), "replicas": 1}, "Worker": worker}
    return manifest


def _parameter_servers():
    manifest = _chief_and_workers()
    replicas = manifest["spec"]["tfReplicaSpecs"]
    replicas["PS"] = {**copy.deepcopy(replicas["Worker"]), "replicas": 2}
    return manifest


def test_a_parameter_server_job_keeps_its_three_task_types_in_tfjobs_tf_config(tmp_path):
    from trainer.steps import create_job_cluster

    job = read_manifest(_parameter_servers())
    assert [(r.type, r.count) for r in job.replicas] == [("chief", 1), ("ps", 2), ("worker", 2)]
    assert job.parameter_servers
    record = create_job_cluster(str(tmp_path), "run-1", True, 2, "local", 2222, num_ps=2)
    assert sorted(record.cluster) == ["chief", "ps", "worker"]
    assert [len(record.cluster[k]) for k in ("chief", "ps", "worker")] == [1, 2, 2]
    assert len(set(sum(record.cluster.values(), []))) == 5, "every task its own address"
    assert _operators_tf_config(record.cluster, "ps", 1) == {
        "cluster": record.cluster,
        "task": {"type": "ps", "index": 1},
        "environment": "cloud",
    }


def test_a_parameter_server_job_without_a_chief_is_refused():
    manifest = _parameter_servers()
    del manifest["spec"]["tfReplicaSpecs"]["Chief"]
    with pytest.raises(UsageError, match=r"PS: parameter-server training needs a Chief .*; the job has PS, Worker$"):
        read_manifest(manifest)


@pytest.mark.parametrize(
    "manifest", [_example, _chief_and_workers, _parameter_servers], ids=["workers", "chief and workers", "with ps"]
)
def test_every_hand_off_of_a_compiled_job_has_the_type_its_component_declares(manifest, tmp_path):
    """As the KFP backend's driver checks it (tests/test_typeflow.py): the task index arrives as an integer."""
    from kfp import compiler

    from pipelines.jobs import tfjob_pipeline
    from tests.support.pipelines import type_flow

    compiler.Compiler().compile(tfjob_pipeline(read_manifest(manifest()), IMAGE), str(tmp_path / "job.yaml"))
    flows = type_flow(next(yaml.safe_load_all((tmp_path / "job.yaml").read_text())))
    assert [f for f in flows if f[3] != f[4]] == []
    indices = [(got, want) for _, task, name, got, want in flows if task.startswith("run-command") and name == "index"]
    loops = {_example: 1, _chief_and_workers: 2, _parameter_servers: 3}[manifest]
    assert indices == [("NUMBER_INTEGER", "NUMBER_INTEGER")] * loops
    assert {"publish-model", "create-job-cluster"} <= {task for _, task, *_ in flows}
    if manifest is _parameter_servers:
        spec = next(yaml.safe_load_all((tmp_path / "job.yaml").read_text()))
        types = {
            task["inputs"]["parameters"]["task_type"]["runtimeValue"]["constant"]
            for component in spec["components"].values()
            for name, task in component.get("dag", {}).get("tasks", {}).items()
            if name.startswith("run-command")
        }
        assert types == {"chief", "ps", "worker"}
        assert spec["root"]["inputDefinitions"]["parameters"]["chief_timeout"]["parameterType"] == "NUMBER_DOUBLE"


def _exits_with_one(tmp_path):
    """A command that writes its pid (whole: renamed into place), waits for `go`, and exits 1 (as a script whose
    collective failed does)."""
    code = (
        "import os, pathlib, sys, time\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "(d / 'pid.part').write_text(str(os.getpid()))\n"
        "(d / 'pid.part').rename(d / 'pid')\n"
        "while not (d / 'go').exists(): time.sleep(0.02)\n"
        "sys.exit(1)\n"
    )
    return [sys.executable, "-c", code]


def _gone(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@pytest.mark.parametrize("peer_fails", [True, False], ids=["its peer failed", "its peer runs on"])
def test_under_exit_code_a_failure_beside_a_failed_peer_is_a_lost_peer(tmp_path, peer_fails):
    """ExitCode makes 1 permanent; a command's 1 while a peer's supervisor reports its own failure is a lost peer."""
    import threading

    from trainer.cluster.control import Control
    from trainer.cluster.local_processes import free_ports
    from trainer.cluster.supervisor import SupervisedTask, Supervisor
    from trainer.core.errors import EXIT_PEER_UNAVAILABLE

    ports = free_ports(2)
    own, peer = (
        Control(ports[0], [f"localhost:{ports[1]}"], secret=SECRET),
        Control(ports[1], [f"localhost:{ports[0]}"], secret=SECRET),
    )
    peer.set(0, "running")
    task = SupervisedTask(_exits_with_one(tmp_path), dict(os.environ), None, 60, tfjob_spec.restart_policy("ExitCode"))
    supervisor = Supervisor(task, control=own)
    result = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()))
    try:
        thread.start()
        while not (tmp_path / "pid").exists():
            thread.join(0.02)
        pid = int((tmp_path / "pid").read_text())
        (tmp_path / "go").touch()
        while not _gone(pid):
            thread.join(0.02)
        if peer_fails:
            peer.set(0, "failed")
        thread.join(30)
    finally:
        own.close()
        peer.close()
    assert result == [EXIT_PEER_UNAVAILABLE if peer_fails else 1]


def test_one_task_in_all_gets_no_tf_config_as_the_operator_gave_none():
    """kubeflow/trainer v1.7-v1.9 pkg/controller.v1/tensorflow/util.go isDistributed: replicas in all != 1."""
    assert _operators_tf_config({"worker": ["a:1"]}, "worker", 0) is None
    assert _operators_tf_config({"chief": ["a:1"]}, "chief", 0) is None
    assert _operators_tf_config({"worker": ["a:1"], "evaluator": ["b:1"]}, "worker", 0) == {
        "cluster": {"worker": ["a:1"], "evaluator": ["b:1"]},
        "task": {"type": "worker", "index": 0},
        "environment": "cloud",
    }


def test_the_evaluator_is_in_the_cluster_of_tf_config_and_not_a_peer_of_the_control_channel(tmp_path):
    """The operator's genClusterSpec puts every replica type in the cluster, the Evaluator too; it never restarts."""
    from trainer.cluster.cluster_record import ClusterRecord
    from trainer.steps import create_job_cluster

    record = create_job_cluster(str(tmp_path), "run-1", True, 2, "local", 2222, evaluator=True)
    assert [len(record.cluster[k]) for k in ("chief", "worker", "evaluator")] == [1, 2, 1]
    assert ClusterRecord.read(str(tmp_path)) == record
    assert _operators_tf_config(record.cluster, "evaluator", 0) == {
        "cluster": record.cluster,
        "task": {"type": "evaluator", "index": 0},
        "environment": "cloud",
    }
    alone = create_job_cluster(str(tmp_path / "alone"), "run-2", True, 0, "local", 2222)
    assert list(alone.cluster) == ["chief"] and _operators_tf_config(alone.cluster, "chief", 0) is None


def test_an_env_chain_expands_in_the_manifests_order_whatever_the_names_sort_as():
    job = read_manifest(yaml.safe_load((ROOT / "tests" / "tfjob_corpus" / "08-aws-secret-env.yaml").read_text()))
    worker = job.replica("worker")
    assert worker.env == (("DATA_ROOT", "s3://team-mnist/run"), ("CKPT", "$(DATA_ROOT)/ckpt"))
    env = run.task_environment({}, [list(pair) for pair in worker.env], "/m", "/c")
    assert env["CKPT"] == "s3://team-mnist/run/ckpt"
    assert [tfjob_spec.expand(part, env) for part in worker.command][-1] == "--tf-model-dir=s3://team-mnist/run/ckpt"
    assert worker.env_from == (
        EnvSource("AWS_ACCESS_KEY_ID", "secret", "aws-creds", "AWS_ACCESS_KEY_ID"),
        EnvSource("AWS_SECRET_ACCESS_KEY", "secret", "aws-creds", "AWS_SECRET_ACCESS_KEY"),
        EnvSource("AWS_REGION", "config_map", "aws-settings", "region", optional=True),
        EnvSource("NODE_NAME", "field", "spec.nodeName"),
    )


def test_the_compiled_env_is_a_list_in_the_manifests_order(tmp_path):
    from kfp import compiler

    from pipelines.jobs import tfjob_pipeline

    manifest = yaml.safe_load((ROOT / "tests" / "tfjob_corpus" / "08-aws-secret-env.yaml").read_text())
    compiler.Compiler().compile(tfjob_pipeline(read_manifest(manifest), IMAGE), str(tmp_path / "job.yaml"))
    spec = next(yaml.safe_load_all((tmp_path / "job.yaml").read_text()))
    task = next(
        t
        for c in spec["components"].values()
        for n, t in c.get("dag", {}).get("tasks", {}).items()
        if n.startswith("run-command")
    )
    assert task["inputs"]["parameters"]["env"]["runtimeValue"]["constant"] == [
        ["DATA_ROOT", "s3://team-mnist/run"],
        ["CKPT", "$(DATA_ROOT)/ckpt"],
    ]
    component = spec["components"][task["componentRef"]["name"]]
    assert component["inputDefinitions"]["parameters"]["env"]["parameterType"] == "LIST"


def test_resources_are_kept_as_written_and_deadlines_and_backoff_become_the_tasks_own(tmp_path):
    from kfp import compiler

    from pipelines.factories import DEFAULT_PODS
    from pipelines.jobs import replica_pods, tfjob_pipeline

    corpus = ROOT / "tests" / "tfjob_corpus"
    kueue = read_manifest(yaml.safe_load((corpus / "10-kueue-sample.yaml").read_text()))
    pods, warnings = replica_pods(kueue.replica("worker"), DEFAULT_PODS)
    assert (pods.cpu_request, pods.cpu_limit, pods.memory_request, pods.memory_limit) == ("500m", "", "200Mi", "")
    assert warnings == [] and pods.timeout_seconds == 0
    bare = read_manifest(yaml.safe_load((corpus / "01-simple.yaml").read_text()))
    pods, warnings = replica_pods(bare.replica("worker"), DEFAULT_PODS)
    assert (pods.cpu_request, pods.cpu_limit, pods.memory_request, pods.memory_limit) == ("1", "2", "2Gi", "4Gi")
    assert warnings == [
        "spec.tfReplicaSpecs.worker resources: no cpu request or limit; this project's default is used (request 1, "
        "limit 2)",
        "spec.tfReplicaSpecs.worker resources: no memory request or limit; this project's default is used (request "
        "2Gi, limit 4Gi)",
    ]
    odd = read_manifest(yaml.safe_load((corpus / "14-odd-quantities.yaml").read_text())).replica("worker")
    assert dict(odd.requests) == {"cpu": "500m", "memory": str(3 * 2**29)}
    assert dict(odd.limits) == {"cpu": "2", "memory": "10000000000"}

    nightly = read_manifest(yaml.safe_load((corpus / "15-deadline-backoff.yaml").read_text()))
    assert (nightly.deadline, nightly.backoff_limit, nightly.success_policy) == (86400, 3, "AllWorkers")
    compiler.Compiler().compile(tfjob_pipeline(nightly, IMAGE), str(tmp_path / "job.yaml"))
    spec, platform = yaml.safe_load_all((tmp_path / "job.yaml").read_text())
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-run-command"]
    assert int(executor["activeDeadlineSeconds"]) == 86400
    assert spec["root"]["inputDefinitions"]["parameters"]["max_restarts"]["defaultValue"] == 3


def test_restart_policies_are_per_replica_and_never_stops_a_mirrored_jobs_restarts_only(tmp_path):
    from kfp import compiler

    from pipelines.jobs import tfjob_pipeline

    def max_restarts(manifest):
        compiler.Compiler().compile(tfjob_pipeline(read_manifest(manifest), IMAGE), str(tmp_path / "job.yaml"))
        spec = next(yaml.safe_load_all((tmp_path / "job.yaml").read_text()))
        return spec["root"]["inputDefinitions"]["parameters"]["max_restarts"]["defaultValue"]

    servers = _parameter_servers()
    servers["spec"]["tfReplicaSpecs"]["PS"]["restartPolicy"] = "Never"
    assert max_restarts(servers) == 2, "a PS job's tasks restart alone, each by its own policy"
    mirrored = _chief_and_workers()
    mirrored["spec"]["tfReplicaSpecs"]["Chief"]["restartPolicy"] = "Never"
    assert max_restarts(mirrored) == 0, "a MultiWorkerMirrored job fails together: the operator failed it at once"


def test_a_finished_peer_is_finished_not_lost_and_a_restart_does_not_wait_for_it():
    from trainer.cluster.control import PEER_POLL_SECONDS, Control
    from trainer.cluster.local_processes import free_ports
    from trainer.core.errors import PeerFinishedError

    ports = free_ports(3)
    own = Control(ports[0], [f"localhost:{ports[1]}", f"localhost:{ports[2]}"], secret=SECRET)
    done, running = Control(ports[1], [], secret=SECRET), Control(ports[2], [], secret=SECRET)
    try:
        done.set(0, "done")
        running.set(0, "formed")
        assert own.lost_peer(0) is None
        done.close(linger=PEER_POLL_SECONDS / 10)
        assert own.lost_peer(0) is None, "its supervisor ended after it finished: not a lost pod"
        running.close()
        assert own.lost_peer(0) == f"localhost:{ports[2]}"
        with pytest.raises(PeerFinishedError, match=rf"the peers at localhost:{ports[1]} finished successfully"):
            own.barrier(1, deadline=float("inf"))
    finally:
        own.close()


def test_quantities_are_read_as_kubernetes_reads_them():
    from trainer.core import quantity

    assert [quantity.cpu(v, "cpu") for v in ("2", 4, 0.5, "250m", "1.5", "1e0", ".1")] == [
        "2",
        "4",
        "500m",
        "250m",
        "1500m",
        "1",
        "100m",
    ]
    assert [quantity.memory(v, "memory") for v in ("4Gi", "512M", "1.5Gi", "1e9", "128974848", "129e6", "1k")] == [
        "4Gi",
        "512M",
        "1610612736",
        "1000000000",
        "128974848",
        "129000000",
        "1000",
    ]
    for bad in ("4GB", "-1", "1.5.0", "", "two", True, "1K", "1e3m"):
        with pytest.raises(UsageError, match=r"^memory .* is not allowed; allowed: a Kubernetes quantity"):
            quantity.memory(bad, "memory")


@pytest.mark.parametrize(
    "where, value, refusal",
    [
        (("tolerations",), [{"key": "gpu", "value": 0}], "tolerations[0]: key, operator, value and effect are strings"),
        (("nodeSelector",), {"gpu-count": 1}, "nodeSelector.gpu-count: 1 is not a string, as Kubernetes requires"),
        (("securityContext",), {"runAsGroup": -1}, "securityContext.runAsGroup: -1; allowed: a user or group id ≥ 0"),
        (
            ("affinity",),
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": [1]}]}]}}},
            "matchExpressions[0]: a requirement needs a key, an operator",
        ),
    ],
    ids=["toleration value", "selector value", "group id", "requirement value"],
)  # fmt: skip
def test_a_value_kubernetes_would_reject_is_refused_at_compile_not_in_the_cluster(where, value, refusal):
    manifest = _example()
    manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][where[0]] = value
    with pytest.raises(UsageError, match=re.escape(refusal)):
        read_manifest(manifest)


def test_what_a_review_found_a_manifest_can_hold(tmp_path):
    """An Evaluator's default Never, a null env value, a claim mounted twice, a volume naming nothing, a default
    spelled out, a short deadline: each as the operator and Kubernetes took it, or refused naming the field."""
    from pipelines.factories import DEFAULT_PODS
    from pipelines.jobs import replica_pods
    from pipelines.tfjob import for_this_machine

    evaluated = _chief_and_workers()
    replicas = evaluated["spec"]["tfReplicaSpecs"]
    replicas["Chief"]["restartPolicy"] = replicas["Worker"]["restartPolicy"] = "OnFailure"
    replicas["Evaluator"] = {**copy.deepcopy(replicas["Worker"]), "replicas": 1}
    del replicas["Evaluator"]["restartPolicy"]
    assert read_manifest(evaluated).max_restarts(3) == 3, "the evaluator is not in the collectives"

    manifest = _example()
    spec = manifest["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["containers"][0]["env"] = [{"name": "EMPTY", "value": None}]
    spec["hostNetwork"], spec["dnsPolicy"] = False, "ClusterFirst"
    spec["containers"][0]["workingDir"] = "/app/pipelines"
    manifest["spec"]["runPolicy"] = {"activeDeadlineSeconds": 30}
    job = read_manifest(manifest)
    assert job.replica("worker").env == (("EMPTY", ""),)
    assert any(w.startswith("spec.tfReplicaSpecs.Worker.template.spec.hostNetwork: False is") for w in job.warnings)
    assert replica_pods(job.replica("worker"), DEFAULT_PODS, job.deadline)[0].timeout_seconds == 30
    local = for_this_machine(job, {"/app": "/repo", "/train": str(tmp_path)})
    assert local.replica("worker").working_dir == "/repo/pipelines"

    twice = _example()
    spec = twice["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["containers"][0]["volumeMounts"].append({"name": "training", "mountPath": "/out", "subPath": "out"})
    spec["volumes"].append({"name": "nameless", "persistentVolumeClaim": {"readOnly": True}})
    with pytest.raises(UsageError) as refused:
        read_manifest(twice)
    assert "volumeMounts[1] (training): strat-volume is mounted twice (/train and /out)" in str(refused.value)
    assert "volumes[1] (nameless).persistentVolumeClaim.claimName: is missing" in str(refused.value)
