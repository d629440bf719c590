"""Parameter-server mode with real processes: chief + ps + workers, a killed worker, a killed chief."""

import json
import re
import time

import pytest

from tests.support.processes import trainer_args
from tests.support.ps_cluster import kill_one
from trainer.cluster.topology import build_tf_config, make_cluster
from trainer.core.errors import EXIT_PEER_UNAVAILABLE, ChiefFailedError, PeerUnavailableError
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
