"""A TFJob-era script run here as its pipeline's tasks (`pipelines/tfjob.py --local`, 2 workers at once): a worker
killed in epoch 2 restarts in place with its peer, the run finishes and the chief's model is published."""

import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT
from tests.support.processes import Streamed, child_env, worker_process
from trainer.publishing.publish import latest
from trainer.records.job import JobRecord

EXAMPLE = ROOT / "pipelines" / "tfjob_example" / "tfjob.yaml"


def _training_process(index: int) -> int | None:
    """The pid of the example's train.py running as worker INDEX (read from its TF_CONFIG), if one runs."""

    def script(argv):
        return any(part.endswith(b"tfjob_example/train.py") for part in argv) and argv[0] != b"" and b"-m" not in argv

    return worker_process(index, script)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """The example's pipeline with worker 1's training process SIGKILLed once epoch 2 has started."""
    base = tmp_path_factory.mktemp("command")
    published = base / "published"
    # The example's 5 epochs of the sample take seconds; 8 leave time to kill a worker in epoch 2.
    manifest = base / "tfjob.yaml"
    manifest.write_text(EXAMPLE.read_text().replace("--epochs=5", "--epochs=8"))
    run = Streamed(
        [
            sys.executable, "-m", "pipelines.tfjob", str(manifest), "--local", "--mount", f"/app={ROOT}",
            "--saved-model", "/train/saved_model", "--publish-uri", str(published), "--output-dir", str(base / "out"),
        ],
        child_env(),
    )  # fmt: skip
    code, pid = run.kill_once(r"Epoch 2/8", lambda: _training_process(1))
    return code, run.lines, published, pid


@pytest.mark.slow
def test_a_killed_worker_restarts_in_place_with_its_peer_and_the_run_finishes(killed_run):
    code, lines, _, pid = killed_run
    output = "\n".join(lines)
    assert code == 0, output[-5000:]
    assert "worker 1: restart 1 of 2 in place (exit code 137)" in output, output[-5000:]
    # The survivor's supervisor stops it (138), unless TensorFlow's own error reaches the script first (exit 1).
    assert re.search(r"worker 0: restart 1 of 2 in place \(exit code (138|1)\)", output), output[-5000:]
    assert not Path(f"/proc/{pid}").exists()


@pytest.mark.slow
def test_the_converted_job_publishes_the_chiefs_model_with_its_lineage(killed_run):
    code, lines, published, _ = killed_run
    assert code == 0
    version = latest(str(published))
    assert version is not None, "\n".join(lines[-40:])
    assert (Path(version.path) / "saved_model.pb").is_file()
    assert version.lineage["task"] == "worker:0"
    assert version.lineage["command"][1].endswith("pipelines/tfjob_example/train.py")
    assert version.metrics["accuracy"] >= 0.9, version.metrics
    assert JobRecord.read(version.lineage["model_uri"]).restarts == 1, "the chief restarted once, in place"


_ONE_TASK = """
import sys
from trainer.core.entry import run_step
from trainer.steps import command_task, create_job_cluster

cluster, model, script = sys.argv[1:4]
run_step(
    create_job_cluster, output_dir=cluster, run_id="r1", chief=False, num_workers=1, cluster_mode="local", port=2222
)
run_step(
    command_task, cluster_dir=cluster, task_type="worker", index=0, model_dir=model, run_id="r1",
    command=[sys.executable, script, "--data_dir=" + sys.argv[4], "--saved_model_dir=" + model + "/saved_model",
             "--checkpoint_dir=" + model + ".ckpt", "--epochs=1000"],
    env={}, restart_policy="OnFailure", saved_model="", image="local", startup_timeout=120.0,
    unschedulable_timeout=120.0, max_restarts=2, checkpoint_dir="", cluster_mode="local",
)
"""


@pytest.mark.slow
def test_sigterm_stops_a_command_promptly_with_143_and_leaves_no_process(tmp_path):
    """What KFP does to a cancelled run's pods: SIGTERM to the step, which stops the user's command and exits 143."""
    task = Streamed(
        [
            sys.executable, "-c", _ONE_TASK, str(tmp_path / "cluster"), str(tmp_path / "model"),
            str(EXAMPLE.parent / "train.py"), str(ROOT / "data" / "mnist-sample"),
        ],
        child_env(),
    )  # fmt: skip
    try:
        task.wait_for(r"Epoch 2/1000", 300)
        pid = _command_process(tmp_path / "model")
        assert pid, "\n".join(task.lines[-30:])
        task.proc.send_signal(signal.SIGTERM)
        code = task.finish(60)
    finally:
        task.kill()
    assert code == 143, "\n".join(task.lines[-30:])
    assert _gone(pid), "the command did not outlive its supervisor"
    assert "restart" not in "\n".join(task.lines), "a cancelled task is not restarted"


def _command_process(model_dir: Path) -> int | None:
    """The pid of the example's train.py whose MODEL_DIR is `model_dir` (a lone task has no TF_CONFIG), if one runs."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            any(part.endswith(b"tfjob_example/train.py") for part in argv)
            and f"MODEL_DIR={model_dir}".encode() in environ
        ):
            return int(pid)
    return None


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] in ("Z", "X")
    except OSError:
        return True
