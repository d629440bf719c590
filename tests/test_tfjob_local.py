"""`pipelines/tfjob.py --local`: every task of a TFJob at once as local processes (`trainer.local_job`).

A Chief + Worker MultiWorkerMirrored job with an Evaluator trains with both training tasks in sync while the evaluator
watches, and ends with the chief; a one-task job runs with no TF_CONFIG; a Chief + PS + Worker job runs all three
together and publishes; a failed chief stops the others and names itself; SIGTERM stops every task; a job larger than
this machine is refused before anything starts.
"""

import json
import signal
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.paths import ROOT, SAMPLE_DIR
from tests.support.processes import Streamed, child_env, run_module, script_processes
from trainer import local_job
from trainer.command.tfjob_spec import read_manifest
from trainer.config.contract import MAX_WORKERS
from trainer.core.cpus import CpuBudget
from trainer.core.errors import TaskFailedError, UsageError
from trainer.publishing.publish import latest
from trainer.records.job import JobRecord

TRAIN = ROOT / "pipelines" / "tfjob_example" / "train.py"
PS_SCRIPT = ROOT / "tests" / "user_code" / "ps_train.py"


def _replica(command, args=(), count=1, env=None, policy="Never"):
    container = {"name": "tensorflow", "image": "local", "command": list(command), "args": list(args)}
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return {"replicas": count, "restartPolicy": policy, "template": {"spec": {"containers": [container]}}}


def _manifest(name, replicas):
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name},
        "spec": {"tfReplicaSpecs": replicas},
    }


def _ps_manifest(chief_env=None, workers=1, python="python"):
    command = [python, str(PS_SCRIPT)]
    return _manifest(
        "ps-job",
        {
            "Chief": _replica(command, env=chief_env),
            "PS": _replica(command),
            "Worker": _replica(command, count=workers),
        },
    )


def test_the_tasks_are_the_jobs_replicas_in_order_and_the_chief_is_chief_0_else_worker_0():
    command = [sys.executable, "x.py"]
    job = read_manifest(_ps_manifest(workers=2))
    tasks = local_job.job_tasks(job)
    assert [t.name for t in tasks] == ["chief 0", "ps 0", "worker 0", "worker 1"]
    assert local_job.chief_of(tasks).name == "chief 0"
    workers = local_job.job_tasks(read_manifest(_manifest("w", {"Worker": _replica(command, count=2)})))
    assert local_job.chief_of(workers).name == "worker 0"
    assert [t.directory for t in workers] == ["worker-0", "worker-1"]


def test_the_first_failure_fails_the_run_and_an_evaluator_never_does():
    replica = read_manifest(_manifest("w", {"Worker": _replica(["python", "x.py"])})).replicas[0]
    chief, worker, evaluator = (local_job.Task(t, 0, replica) for t in ("chief", "worker", "evaluator"))
    assert local_job.first_failure([(chief, 0), (worker, 0), (evaluator, 1)]) is None
    assert local_job.first_failure([(evaluator, 1), (worker, 138), (chief, 143)]) == (worker, 138)
    assert local_job.first_failure([(chief, 0), (worker, 0)]) is None


def test_three_tasks_fit_two_cpus_and_24_gib_and_the_bound_is_the_fewer_of_cpu_and_memory():
    two = CpuBudget(2.0, "affinity: CPUs 0-1")
    bound, why = local_job.capacity(two, 24 * 1024)
    assert bound == 4, why
    assert "2 per CPU of 2 CPUs" in why and "1024 MiB" in why
    local_job.check_tasks(3, two, 24 * 1024)
    assert local_job.capacity(CpuBudget(16.0, "cores"), 4 * 1024)[0] == 4, (
        "memory bounds a big machine with little free"
    )
    assert local_job.capacity(CpuBudget(0.5, "cgroup"), 24 * 1024)[0] == 1
    with pytest.raises(UsageError, match=r"the job has 5 tasks .* allowed here: 1 to 4 \(2 per CPU"):
        local_job.check_tasks(5, two, 24 * 1024)


def test_a_job_larger_than_this_machine_is_refused_before_anything_starts(tmp_path):
    bound, _ = local_job.capacity()
    manifest = tmp_path / "big.yaml"
    manifest.write_text(yaml.safe_dump(_ps_manifest(workers=bound - 1)))
    out = tmp_path / "out"
    result = run_module("pipelines.tfjob", str(manifest), "--local", "--output-dir", str(out), timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stderr
    # A machine that runs more than 64 tasks at once meets the manifest's own bound first.
    refusal = f"the job has {bound + 1} tasks" if bound < MAX_WORKERS else f"allowed: at most {MAX_WORKERS}"
    assert len(errors) == 1 and refusal in errors[0], errors
    assert not out.exists(), "nothing was written or started"


def test_a_bad_setting_is_refused_before_anything_starts(tmp_path):
    job = read_manifest(_manifest("w", {"Worker": _replica([sys.executable, "x.py"])}))
    with pytest.raises(UsageError, match="startup"):
        local_job.run_job(job, str(tmp_path / "run"), startup_timeout=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_parameter_server_job_runs_its_three_tasks_at_once_and_publishes(tmp_path):
    manifest = tmp_path / "ps.yaml"
    manifest.write_text(yaml.safe_dump(_ps_manifest()))
    published = tmp_path / "published"
    result = run_module(
        "pipelines.tfjob", str(manifest), "--local", "--output-dir", str(tmp_path / "out"),
        "--publish-uri", str(published), timeout=400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "[chief 0] chief: trained, loss" in output
    for name in ("ps 0", "worker 0"):
        assert f"[{name}] " in output and f"{name}: the chief finished successfully" in output, output[-4000:]
    version = latest(str(published))
    assert version is not None and version.lineage["task"] == "chief:0"
    assert f"published: version {version.version} at {version.path}" in result.stdout
    model = next(line for line in result.stdout.splitlines() if line.startswith("model: "))[len("model: ") :]
    assert (Path(model) / "saved_model" / "saved_model.pb").is_file()
    assert script_processes(PS_SCRIPT, tmp_path) == []


@pytest.mark.slow
def test_a_failed_chief_fails_the_run_naming_it_and_stops_the_others(tmp_path):
    job = read_manifest(_ps_manifest(chief_env={"FAIL_AT_START": "1"}, python=sys.executable))
    with pytest.raises(TaskFailedError) as failed:
        local_job.run_job(job, str(tmp_path / "run"), chief_timeout=60.0)
    assert failed.value.code == 1
    assert failed.value.reason.startswith("chief 0 failed with exit code 1"), failed.value.reason
    assert script_processes(PS_SCRIPT, tmp_path) == []


@pytest.mark.slow
def test_sigterm_stops_every_task_with_143_and_leaves_no_process(tmp_path):
    manifest = tmp_path / "ps.yaml"
    manifest.write_text(yaml.safe_dump(_ps_manifest(chief_env={"EPOCHS": "1000"})))
    run = Streamed(
        [sys.executable, "-m", "pipelines.tfjob", str(manifest), "--local", "--output-dir", str(tmp_path / "out")],
        child_env(),
    )
    try:
        run.wait_for(r"\[chief 0\] Epoch 2/1000", 300)
        assert len(script_processes(PS_SCRIPT, tmp_path)) == 3, "\n".join(run.lines[-30:])
        run.proc.send_signal(signal.SIGTERM)
        code = run.finish(60)
    finally:
        run.kill()
    errors = [line for line in run.lines if line.startswith("error:")]
    assert code == 143, "\n".join(run.lines[-30:])
    assert errors == ["error: stopped by signal 15 (SIGTERM): every task stopped"], errors
    assert script_processes(PS_SCRIPT, tmp_path) == []


@pytest.mark.slow
def test_a_one_task_job_of_a_plain_script_runs_past_the_start_up_timeout(tmp_path, capsys):
    """The operator gave a one-task job no TF_CONFIG (isDistributed); nothing waits for a cluster to form."""
    script = ROOT / "tests" / "user_code" / "single_task.py"
    job = read_manifest(_manifest("single", {"Worker": _replica([sys.executable, str(script)], ["8"])}))
    run = local_job.run_job(job, str(tmp_path / "run"), startup_timeout=2.0)
    output = capsys.readouterr().out
    assert run.codes == {"worker 0": 0}, output[-3000:]
    assert "no TF_CONFIG (one task in all" in output and "single task: " in output
    assert (Path(run.model) / "saved_model" / "saved_model.pb").is_file()


@pytest.mark.slow
def test_a_chief_a_worker_and_an_evaluator_with_an_env_chain_finish_and_the_evaluator_ends_with_the_chief(
    tmp_path, capsys
):
    args = [
        f"--data_dir={SAMPLE_DIR}", "--saved_model_dir=$(MODEL_DIR)/saved_model",
        "--checkpoint_dir=$(CHECKPOINT_DIR)/backup", "--metrics_file=$(METRICS)", "--epochs=2",
    ]  # fmt: skip
    # METRICS sorts before OUT: only the manifest's order expands it.
    trainer = _replica(
        [sys.executable, str(TRAIN)], args, env={"OUT": "$(MODEL_DIR)", "METRICS": "$(OUT)/metrics.json"}
    )
    evaluator = _replica(
        [sys.executable, str(ROOT / "tests" / "user_code" / "sidecar_evaluator.py"), "$(CHECKPOINT_DIR)"]
    )
    job = read_manifest(_manifest("evaluated", {"Chief": trainer, "Worker": trainer, "Evaluator": evaluator}))
    run = local_job.run_job(job, str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "checkpoints"))
    output = capsys.readouterr().out
    assert run.codes == {"chief 0": 0, "worker 0": 0, "evaluator 0": 0}, output[-3000:]
    for name in ("chief 0", "worker 0"):
        assert f"[{name}] TF_CONFIG task: " in output and "replicas in sync: 2" in output, output[-3000:]
    assert run.model == str(tmp_path / "run" / "tasks" / "chief-0" / "model")
    assert (Path(run.model) / "saved_model" / "saved_model.pb").is_file()
    assert JobRecord.read(run.model).task == "chief:0"
    assert JobRecord.read(run.model).metrics["accuracy"] > 0.5, "the chief wrote $(OUT)/metrics.json, expanded in order"
    worker = tmp_path / "run" / "tasks" / "worker-0"
    assert "'type': 'worker', 'index': 0}, replicas in sync: 2" in (worker / local_job.LOG_FILE).read_text()
    assert json.loads((worker / "model" / "worker.json").read_text())["task"] == "worker:0"
    assert "[evaluator 0] evaluator: TF_CONFIG cluster ['chief', 'evaluator', 'worker']" in output
    assert "[evaluator 0] evaluator: new checkpoint" in output
    assert "evaluator 0: the chief finished successfully" in output, output[-3000:]
    assert script_processes(ROOT / "tests" / "user_code" / "sidecar_evaluator.py", tmp_path) == []
