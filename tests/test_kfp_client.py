"""Upload, run and schedule: the real kfp.Client over real HTTP against a local stand-in of the KFP v2beta1 API."""

import pytest

from pipelines import kfp_client
from tests.kfp_standin import KfpStandIn
from trainer.core.errors import UsageError


@pytest.fixture
def kfp_server(httpserver):
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the stand-in's own access log is not the CLI's output
    server = KfpStandIn()
    server.install(httpserver)
    return server


@pytest.fixture
def cli(httpserver, capsys, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
    import mnist

    monkeypatch.delenv("KF_PIPELINES_TOKEN", raising=False)
    host = httpserver.url_for("").rstrip("/")

    def run(*args):
        code = mnist.main([*args, "--host", host, "--image", "registry.example.com/team/kfp-tf-multiworker:0.1.0"])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_first_upload_creates_the_pipeline(kfp_server, cli):
    code, out, err = cli("--upload")
    assert code == 0, err
    (pipeline,) = kfp_server.pipelines.values()
    assert pipeline["display_name"] == "mnist-multiworker"
    (version,) = kfp_server.versions[pipeline["pipeline_id"]]
    assert version["uploaded_bytes"] > 1000
    assert f"pipeline {pipeline['pipeline_id']} version {version['pipeline_version_id']}" in out
    assert f"/#/pipelines/details/{pipeline['pipeline_id']}/version/{version['pipeline_version_id']}" in out


def test_upload_of_an_existing_name_adds_a_version(kfp_server, cli):
    assert cli("--upload")[0] == 0
    code, out, err = cli("--upload")
    assert code == 0, err
    assert len(kfp_server.pipelines) == 1
    (versions,) = kfp_server.versions.values()
    assert len(versions) == 2
    assert versions[1]["display_name"].startswith("v0.1.0-")
    assert ("POST", "/apis/v2beta1/pipelines/upload_version") in kfp_server.requests


def test_run_carries_version_experiment_and_typed_parameters(kfp_server, cli):
    code, out, err = cli(
        "--run",
        "--experiment",
        "nightly",
        "--param",
        "num_workers=4",
        "--param",
        "learning_rate=0.002",
        "--param",
        "source=tfds:fashion_mnist",
        "--run-name",
        "try-1",
    )
    assert code == 0, err
    (experiment,) = kfp_server.experiments.values()
    assert experiment["display_name"] == "nightly"
    (run,) = kfp_server.runs
    (pipeline,) = kfp_server.pipelines.values()
    (version,) = kfp_server.versions[pipeline["pipeline_id"]]
    assert run["display_name"] == "try-1"
    assert run["experiment_id"] == experiment["experiment_id"]
    assert run["pipeline_version_reference"] == {
        "pipeline_id": pipeline["pipeline_id"],
        "pipeline_version_id": version["pipeline_version_id"],
    }
    assert run["runtime_config"]["parameters"] == {
        "num_workers": 4,
        "learning_rate": 0.002,
        "source": "tfds:fashion_mnist",
    }
    assert f"/#/runs/details/{run['run_id']}" in out


def test_existing_experiment_is_reused(kfp_server, cli):
    assert cli("--run", "--experiment", "nightly")[0] == 0
    assert cli("--run", "--experiment", "nightly")[0] == 0
    assert len(kfp_server.experiments) == 1 and len(kfp_server.runs) == 2


def test_schedule_sends_cron_concurrency_catchup_and_window(kfp_server, cli):
    code, out, err = cli(
        "--schedule",
        "0 0 2 * * *",
        "--max-concurrency",
        "2",
        "--no-catchup",
        "--start",
        "2027-01-01T00:00:00Z",
        "--end",
        "2027-12-31T00:00:00Z",
        "--param",
        "epochs=20",
        "--run-name",
        "nightly-mnist",
    )
    assert code == 0, err
    (recurring,) = kfp_server.recurring_runs
    assert recurring["trigger"]["cron_schedule"]["cron"] == "0 0 2 * * *"
    assert recurring["trigger"]["cron_schedule"]["start_time"].startswith("2027-01-01T00:00:00")
    assert recurring["trigger"]["cron_schedule"]["end_time"].startswith("2027-12-31T00:00:00")
    assert recurring["max_concurrency"] in ("2", 2)
    assert recurring["no_catchup"] is True
    assert recurring["mode"] == "ENABLE"
    assert recurring["display_name"] == "nightly-mnist"
    assert recurring["runtime_config"]["parameters"] == {"epochs": 20}
    (pipeline,) = kfp_server.pipelines.values()
    assert recurring["pipeline_version_reference"]["pipeline_id"] == pipeline["pipeline_id"]


def test_every_sends_an_interval(kfp_server, cli):
    assert cli("--every", "1d12h")[0] == 0
    (recurring,) = kfp_server.recurring_runs
    assert recurring["trigger"]["periodic_schedule"]["interval_second"] in ("129600", 129600)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--schedule", "0 2 * * *"],
            "cron '0 2 * * *' has 5 fields; KFP cron has 6 with seconds first: '0 0 2 * * *'",
        ),
        (["--schedule", "0 0 25 * * *"], "hour '25' is not allowed; allowed: 0-23"),
        (["--every", "soon"], "duration 'soon' is not allowed"),
        (
            ["--run", "--param", "num_wrokers=2"],
            "--param 'num_wrokers' is not a parameter of this pipeline; allowed: batch_size",
        ),
        (["--run", "--param", "num_workers=two"], "--param num_workers='two' is not a valid integer"),
        (["--schedule", "@daily", "--start", "tomorrow"], "--start 'tomorrow' is not an RFC 3339 time"),
        (["--every", "1h", "--max-concurrency", "0"], "--max-concurrency 0 is not allowed"),
        (["--run", "--max-concurrency", "2"], "unrecognized arguments: --max-concurrency 2"),
    ],
)
def test_bad_input_is_refused_before_any_request(kfp_server, cli, args, message):
    code, out, err = cli(*args)
    assert code == 2
    assert err.strip().splitlines() == [f"error: {message}"] or message in err.strip().splitlines()[-1]
    assert kfp_server.requests == []


def test_server_error_is_one_line_and_nonzero(kfp_server, cli):
    kfp_server.fail_with = 500
    code, out, err = cli("--run")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert (
        lines[0].startswith("error: KFP server http://")
        and "answered HTTP 500" in lines[0]
        and "database is locked" in lines[0]
    )


def test_token_and_namespace_reach_the_server(kfp_server, cli, httpserver, monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    assert cli("--run", "--token-file", str(token), "--namespace", "kubeflow-user-example-com")[0] == 0
    request, _ = httpserver.log[-1]
    assert request.headers["Authorization"] == "Bearer s3cret"
    (experiment,) = kfp_server.experiments.values()
    assert experiment["namespace"] == "kubeflow-user-example-com"
    assert ("GET", "/apis/v2beta1/healthz") not in kfp_server.requests


@pytest.mark.parametrize(
    ("cron", "ok"),
    [
        ("0 0 2 * * *", True),
        ("0 */15 * * * ?", True),
        ("0 30 9 ? * MON-FRI", True),
        ("@daily", True),
        ("0 0 0 1 JAN *", True),
        ("60 0 0 * * *", False),
        ("* * * *", False),
    ],
)
def test_cron_checker(cron, ok):
    if ok:
        assert kfp_client.check_cron(cron) == cron
    else:
        with pytest.raises(UsageError):
            kfp_client.check_cron(cron)
