"""Parameter-server mode with real processes: chief + ps + workers, a killed worker, a killed chief."""

import json
import re
import time

import pytest

from tests.support.processes import launch, trainer_args
from tests.support.ps_cluster import kill_one
from trainer.cluster.topology import build_tf_config, make_cluster
from trainer.config.contract import ClusterConfig, RuntimeConfig, TrainConfig
from trainer.core.errors import EXIT_PEER_UNAVAILABLE, ChiefFailedError, PeerUnavailableError, UsageError
from trainer.core.runs import run_key
from trainer.training import parameter_server as ps


@pytest.mark.slow
def test_a_lost_parameter_server_fails_the_job_fast_naming_it(sample_data, tmp_path):
    status = str(tmp_path / "status.json")
    procs, codes, elapsed = kill_one(sample_data, tmp_path, status, {}, victim=("ps", 0))
    chief = procs[("chief", 0)]
    assert codes[("chief", 0)] == EXIT_PEER_UNAVAILABLE, chief.lines[-20:]
    assert any(
        re.match(
            r"error: lost contact with a parameter server during training \((.*; )?ps 0 at localhost:\d+ "
            r"\(Connection refused\)[;)]",
            line,
        )
        for line in chief.lines
    ), "\n".join(chief.lines[-30:])
    assert codes[("worker", 0)] == codes[("worker", 1)] == 1, "the workers exit when the chief reports the failure"
    for key in (("worker", 0), ("worker", 1)):
        assert any("the chief failed: lost contact with a parameter server" in line for line in procs[key].lines)
        assert not any(line.startswith("Traceback") for line in procs[key].lines), "one line, no traceback"
    assert elapsed < 60 and not (tmp_path / "model").exists()


def test_status_states_decide_the_servers_exit_code(tmp_path):
    uri = str(tmp_path / "status.json")
    with ps.StatusPublisher(uri):
        assert json.loads((tmp_path / "status.json").read_text())["state"] == "running"
    ps.wait_for_chief(uri, 5, 30, "ps 0")
    with pytest.raises(RuntimeError), ps.StatusPublisher(uri):
        raise RuntimeError("out of memory on the chief")
    assert json.loads((tmp_path / "status.json").read_text()) | {"heartbeat": 0} == {
        "state": "failed",
        "detail": "out of memory on the chief",
        "heartbeat": 0,
    }
    with pytest.raises(ChiefFailedError, match="ps 0: the chief failed: out of memory on the chief"):
        ps.wait_for_chief(uri, 5, 30, "ps 0")
    with pytest.raises(PeerUnavailableError, match=r"worker 0: the chief published no status at \S+ within 1s"):
        ps.wait_for_chief(str(tmp_path / "never.json"), 1, 30, "worker 0")
    (tmp_path / "stale.json").write_text(json.dumps({"state": "running", "heartbeat": time.time() - 100}))
    with pytest.raises(PeerUnavailableError, match=r"worker 1: the chief's heartbeat at \S+ is 10\ds old \(limit 2s\)"):
        ps.wait_for_chief(str(tmp_path / "stale.json"), 5, 2, "worker 1")


def test_ps_task_under_the_mirrored_strategy_is_refused(sample_data, tmp_path, capsys):
    from trainer import train

    spec = make_cluster(["localhost:2", "localhost:3"], chief="localhost:1", ps=["localhost:4"])
    code = train.main(
        [
            "--data",
            sample_data,
            "--model-dir",
            str(tmp_path / "m"),
            "--tf-config",
            json.dumps(build_tf_config(spec, "chief", 0)),
        ]
    )
    assert code == 2
    assert "TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored" in capsys.readouterr().err


def test_parameter_server_needs_chief_ps_and_workers(sample_data, tmp_path, capsys):
    from trainer import train

    code = train.main(["--data", sample_data, "--model-dir", str(tmp_path / "m"), "--strategy", "parameter_server"])
    assert code == 2
    assert (
        "parameter_server strategy needs a TF_CONFIG with one chief, at least one ps and at least one worker"
        in capsys.readouterr().err
    )


def test_validation_under_the_parameter_server_strategy_is_refused_before_anything_starts(
    sample_data, tmp_path, capsys
):
    from trainer import train

    spec = make_cluster(["localhost:2", "localhost:3"], chief="localhost:1", ps=["localhost:4"])
    for job in ("chief", "ps", "worker"):
        code = train.main(
            [
                *trainer_args(sample_data, tmp_path / "m"),
                "--strategy",
                "parameter_server",
                "--validate",
                "--tf-config",
                json.dumps(build_tf_config(spec, job, 0)),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1, err
        assert "validate true is not allowed with the parameter_server strategy" in err
    assert not (tmp_path / "m").exists()


def _outside_a_pod(monkeypatch):
    for name in ("POD_NAMESPACE", "KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)


def test_a_task_outside_a_pod_whose_status_would_go_to_a_configmap_is_refused_before_anything_starts(
    sample_data, tmp_path, capsys, monkeypatch
):
    """cluster_mode kubernetes (trainer-train's default) and no --status-uri: the status's home is a ConfigMap of
    the pod's namespace, which a process outside a pod has none of; every task says so in one line, before its
    server starts."""
    from trainer import train

    _outside_a_pod(monkeypatch)
    spec = make_cluster(["localhost:2", "localhost:3"], chief="localhost:1", ps=["localhost:4"])
    run_id = "0f5e4c1d-2b3a-4c5d-8e9f-0a1b2c3d4e5f"
    for job in ("chief", "ps", "worker"):
        code = train.main(
            [
                *trainer_args(sample_data, tmp_path / "m"),
                "--strategy",
                "parameter_server",
                "--run-id",
                run_id,
                "--tf-config",
                json.dumps(build_tf_config(spec, job, 0)),
            ]
        )
        err = capsys.readouterr().err
        assert code == 2 and err.count("error:") == 1, err
        assert f"keeps the parameter-server status on ConfigMap 'tfw-{run_key(run_id)}-status'" in err
        assert "allowed: --cluster-mode local" in err and "--status-uri" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.status").exists()


def test_a_status_location_a_task_can_reach_passes_the_check(monkeypatch):
    _outside_a_pod(monkeypatch)
    spec = make_cluster(["localhost:2"], chief="localhost:1", ps=["localhost:4"])
    tf_config = build_tf_config(spec, "chief", 0)
    runtime = RuntimeConfig(data_dir="d", model_dir="m", run_id="r1")
    config = TrainConfig(runtime, cluster=ClusterConfig(strategy="parameter_server", cluster_mode="kubernetes"))
    with pytest.raises(UsageError, match="this is not a pod"):
        ps.check_topology(tf_config, config)
    ps.check_topology(tf_config, config.replace(cluster_mode="local"))
    ps.check_topology(tf_config, config.replace(status_uri="gs://team-bucket/status.json"))
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    ps.check_topology(tf_config, config)


@pytest.mark.slow  # chief, ps and two workers as processes
def test_the_readmes_parameter_server_launch_runs_outside_a_pod_its_status_beside_the_model(
    sample_data, tmp_path, monkeypatch
):
    """`trainer-launch --workers 2 --ps 1 -- --data D --model-dir M` as README shows it, from a team's shell
    (S3 keys in the environment, no pod): its tasks are local, so the chief's status is a file of the run beside
    the model directory, and all four tasks exit 0."""
    _outside_a_pod(monkeypatch)
    env = {"AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY"}
    model = tmp_path / "model-ps"
    args = trainer_args(sample_data, model, "--epochs", "1", "--steps-per-epoch", "4")
    launcher = launch("--workers", "2", "--ps", "1", "--", *args, env=env)
    try:
        run_id = launcher.wait_for(r"run id (\S+) \(pass --run-id", 60).group(1)
        code = launcher.finish(300)
    finally:
        launcher.kill()
    text = "\n".join(launcher.lines)
    assert code == 0, text[-4000:]
    status = json.loads((tmp_path / "model-ps.status" / f"{run_key(run_id)}.json").read_text())
    assert status["state"] == "succeeded"
    for label in ("ps 0", "worker 0", "worker 1"):
        assert re.search(rf"^\[{label}\] .*the chief finished successfully; exiting", text, re.M), label
    assert (model / "saved_model" / "saved_model.pb").is_file() and (model / "history.json").is_file()
