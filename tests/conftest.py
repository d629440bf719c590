import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DIR = ROOT / "data" / "mnist-sample"
IMAGE = "registry.example.com/team/kfp-tf-multiworker:9.9.9"


def script_processes(script, under) -> list[int]:
    """The pids of `script`'s processes still running whose MODEL_DIR is under `under` (a test's own tasks)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            running = str(script).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            if running and f"MODEL_DIR={under}".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


def trainer_args(data, model_dir, *extra: str) -> list[str]:
    """The trainer's own flags: `--data DATA --model-dir MODEL_DIR` then EXTRA."""
    return ["--data", str(data), "--model-dir", str(model_dir), *extra]


def run_module(module: str, *args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m module args...` from the repo root and returns the finished process (text output)."""
    full_env = dict(os.environ)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    full_env["PYTHONPATH"] = str(ROOT)
    full_env.pop("TF_CONFIG", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def write_history(directory, run_id: str = "run-1") -> None:
    """A chief's history.json as the trainer writes it, for tests that hand a model directory to a later step."""
    from trainer.training.history import History

    History(
        epochs=({"epoch": 1, "loss": 0.5, "accuracy": 0.9, "examples_per_second": 1000.0},),
        workers=2,
        strategy="multi_worker_mirrored",
        global_batch_size=128,
        steps_per_epoch=31,
        learning_rate=0.0028,
        dataset="sample",
        class_names=tuple("0123456789"),
        image_shape=(28, 28, 1),
        run_id=run_id,
        tensorboard="",
        parameters={"epochs": 1},
    ).write(str(directory))


@pytest.fixture(scope="session")
def compiled_yaml(tmp_path_factory):
    """The compiled YAML of each strategy with the default settings, compiled once a session: {strategy: path}."""
    from pipelines.cli import compile_pipeline
    from pipelines.factories import FACTORIES

    root = tmp_path_factory.mktemp("compiled")
    paths = {}
    for strategy in FACTORIES:
        paths[strategy] = root / f"{strategy}.yaml"
        compile_pipeline(str(paths[strategy]), IMAGE, strategy)
    return paths


def pipeline_spec(path):
    """The pipeline spec (the first YAML document) of a compiled pipeline."""
    import yaml

    return next(yaml.safe_load_all(Path(path).read_text()))


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory) -> str:
    """The shipped sample, prepared once per test session (real digits, 4,000 train / 1,000 test)."""
    from trainer.config.contract import DataConfig
    from trainer.data import sources as prepare

    out = tmp_path_factory.mktemp("prepared") / "mnist-sample"
    prepare.run(DataConfig(source="sample"), str(out))
    return str(out)


@pytest.fixture(scope="session")
def undisturbed_two_workers(sample_data, tmp_path_factory):
    """Two workers through the launcher, 10 epochs, seed 42: (model dir, scratch TMPDIR, completed process)."""
    base = tmp_path_factory.mktemp("undisturbed")
    scratch = base / "scratch"
    scratch.mkdir()
    model_dir = base / "model"
    args = trainer_args(sample_data, model_dir, "--epochs", "10")
    result = run_module("trainer.launch", "--workers", "2", "--", *args, env={"TMPDIR": str(scratch)}, timeout=400)
    return model_dir, scratch, result


@pytest.fixture(autouse=True)
def _no_tf_config_leaks(monkeypatch):
    """Entry points called in-process set TF_CONFIG, as an entry point should; no test may see another's."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
