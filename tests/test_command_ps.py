"""A TFJob with Chief, PS and Worker replicas in command mode: three tasks, each the user's script under its own
supervisor, as the compiled pipeline runs them (`--local` runs them the same way, tests/test_tfjob_local.py)."""

import json
import sys
import uuid

import pytest

from tests.support.paths import ROOT
from tests.support.processes import Streamed, child_env, script_processes
from trainer.records.job import JobRecord
from trainer.steps import create_job_cluster

SCRIPT = ROOT / "tests" / "user_code" / "ps_train.py"
TASKS = (("chief", 0), ("ps", 0), ("worker", 0))
STEP = """
import json, sys
from trainer.core.entry import run_step
from trainer.steps import command_task
run_step(command_task, **json.loads(sys.argv[1]))
"""


def _job(base, chief_env=None, tasks=TASKS, run_id=None):
    """The job's tasks started as the pipeline's run-command steps would run them: {task: (run, model dir)}."""
    if run_id is None:
        run_id = f"ps-{uuid.uuid4().hex[:8]}"
        create_job_cluster(str(base / "cluster"), run_id, True, 1, "local", 2222, num_ps=1)
    started = {"run_id": run_id}
    for task_type, index in tasks:
        model_dir = base / f"{task_type}-{index}"
        arguments = {
            "cluster_dir": str(base / "cluster"), "task_type": task_type, "index": index, "model_dir": str(model_dir),
            "run_id": run_id, "command": [sys.executable, str(SCRIPT)],
            "env": dict(chief_env or {}) if task_type == "chief" else {}, "restart_policy": "Never",
            "saved_model": "", "image": "local", "startup_timeout": 120.0, "unschedulable_timeout": 120.0,
            "max_restarts": 0, "checkpoint_dir": "", "cluster_mode": "local", "chief_timeout": 60.0,
        }  # fmt: skip
        started[task_type] = Streamed([sys.executable, "-c", STEP, json.dumps(arguments)], child_env()), model_dir
    return started


def _finish(job):
    codes = {}
    try:
        for name, (run, _) in _tasks(job).items():
            codes[name] = run.finish(300)
    finally:
        for run, _ in _tasks(job).values():
            run.kill()
    return codes


def _tasks(job):
    return {name: task for name, task in job.items() if name != "run_id"}


@pytest.mark.slow
def test_the_parameter_servers_and_workers_end_when_the_chief_has_trained_and_saved(tmp_path):
    job = _job(tmp_path)
    codes = _finish(job)
    output = {name: "\n".join(run.lines) for name, (run, _) in _tasks(job).items()}
    assert codes == {"chief": 0, "ps": 0, "worker": 0}, output
    assert "chief: trained, loss" in output["chief"]
    for name in ("ps", "worker"):
        assert f"{name} 0: serving" in output[name] and f"{name} 0: the chief finished successfully" in output[name]
    chief_dir = job["chief"][1]
    assert (chief_dir / "saved_model" / "saved_model.pb").is_file()
    assert JobRecord.read(str(chief_dir)).task == "chief:0"
    assert json.loads((job["ps"][1] / "worker.json").read_text()) == {"task": "ps:0", "chief": False}
    assert script_processes(SCRIPT, tmp_path) == [], "the servers' scripts were stopped, not left joined forever"


@pytest.mark.slow
def test_a_failed_chief_ends_the_parameter_servers_and_workers_with_its_failure(tmp_path):
    job = _job(tmp_path, chief_env={"FAIL_AT_START": "1"})
    codes = _finish(job)
    output = {name: "\n".join(run.lines) for name, (run, _) in _tasks(job).items()}
    assert codes == {"chief": 1, "ps": 1, "worker": 1}, output
    for name in ("ps", "worker"):
        assert f"error: {name} 0: the chief failed" in output[name], output[name][-2000:]
    assert script_processes(SCRIPT, tmp_path) == []


@pytest.mark.slow
def test_a_lost_chief_retried_like_kfp_retries_it_takes_over_while_the_servers_keep_serving(tmp_path):
    job = _job(tmp_path, chief_env={"EPOCHS": "30"})
    first, _ = job["chief"]
    first.wait_for(r"Epoch 2/30", 300)
    first.proc.kill()  # the chief's pod is lost: its supervisor at once, its script by PR_SET_PDEATHSIG
    assert first.finish(60) == -9
    retried = _job(tmp_path, chief_env={"EPOCHS": "3"}, tasks=(("chief", 0),), run_id=job["run_id"])
    codes = _finish({**job, "chief": retried["chief"]})
    output = {name: "\n".join(run.lines) for name, (run, _) in _tasks(job).items()}
    retried_output = "\n".join(retried["chief"][0].lines)
    assert codes == {"chief": 0, "ps": 0, "worker": 0}, (output, retried_output)
    assert "chief: trained, loss" in retried_output
    for name in ("ps", "worker"):
        assert f"{name} 0: the chief finished successfully" in output[name]
    assert script_processes(SCRIPT, tmp_path) == []
