"""Fixtures shared across test files; the helpers they and the tests use are in tests/support/."""

import fcntl
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import schedule
from tests.support.pipelines import IMAGE
from tests.support.processes import UNDISTURBED_EPOCHS, run_module, trainer_args


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help=f"write each test file's seconds to PATH ({schedule.DURATIONS.relative_to(schedule.ROOT)} orders the run)",
    )


def pytest_collection_modifyitems(config, items):
    """The longest files first (tests.support.schedule), where pytest-xdist takes them in this order."""
    schedule.longest_first(items, schedule.read())


def pytest_configure(config):
    """Before any test module is imported: google-auth is told this is not a GCE VM, for the session and its children.

    Otherwise every gs:// client without credentials (gcsfs's, TensorFlow's) first probes the metadata server, with
    a backoff of about 15 s where nothing answers; the tests' GCS stand-ins and refusals then come that much later.
    With --record-durations, the controlling process records each file's seconds (tests.support.schedule).
    """
    os.environ.setdefault("NO_GCE_CHECK", "true")
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(schedule.Recorder(Path(path)), "record-durations")


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


@pytest.fixture(scope="session")
def sample_data(tmp_path_factory) -> str:
    """The shipped sample, prepared once per test session (real digits, 4,000 train / 1,000 test)."""
    from trainer.config.contract import DataConfig
    from trainer.data import sources

    out = tmp_path_factory.mktemp("prepared") / "mnist-sample"
    sources.run(DataConfig(source="sample"), str(out))
    return str(out)


def _session_dir(tmp_path_factory, name: str):
    """A directory of this pytest session that its pytest-xdist processes share (the parent of their own)."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    shared.mkdir(exist_ok=True)
    return shared


@pytest.fixture(scope="session")
def undisturbed_tensorboard(tmp_path_factory):
    """Where `undisturbed_two_workers` writes its TensorBoard files (its run id and run directory: undisturbed)."""
    return _session_dir(tmp_path_factory, "undisturbed-tensorboard")


@pytest.fixture(scope="session")
def undisturbed_two_workers(sample_data, undisturbed_tensorboard, tmp_path_factory):
    """Two workers through the launcher, UNDISTURBED_EPOCHS, seed 42, no validation, TensorBoard files in
    `undisturbed_tensorboard`: (model dir, scratch TMPDIR, completed process). One run that several files check,
    run once a session: the first pytest-xdist process to ask runs it, the other waits for its record and reads it
    (the sample it trains on is prepared the same in each)."""
    base = _session_dir(tmp_path_factory, "undisturbed")
    run, record = base / "run", base / "result.json"
    scratch, model_dir = run / "scratch", run / "model"
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.exists():
            scratch.mkdir(parents=True)
            args = trainer_args(sample_data, model_dir, "--epochs", str(UNDISTURBED_EPOCHS), "--run-id", "undisturbed")
            args += ["--tensorboard-dir", str(undisturbed_tensorboard)]
            env = {"TMPDIR": str(scratch)}
            ran = run_module("trainer.launch", "--workers", "2", "--", *args, env=env, timeout=400)
            record.write_text(json.dumps([ran.args, ran.returncode, ran.stdout, ran.stderr]))
        result = subprocess.CompletedProcess(*json.loads(record.read_text()))
    return model_dir, scratch, result


@pytest.fixture(autouse=True)
def _no_tf_config_leaks(monkeypatch):
    """Entry points called in-process set TF_CONFIG, as an entry point should; no test may see another's."""
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture(autouse=True)
def _no_logging_leaks():
    """An entry point called in-process sets the root logger to INFO (`setup_logging`), as it should in its own
    process; no test may see that, whatever ran before it (a test or a session fixture): each starts and ends with
    the logging the session started with. A test that reads an INFO record sets its level on the logger writing it."""
    _reset_logging()
    yield
    _reset_logging()


_STARTED_WITH = {name: logging.getLogger(name).level for name in ("", "tensorflow", "trainer")}  # "": the root
_HANDLERS_STARTED_WITH = list(logging.getLogger().handlers)


def _reset_logging() -> None:
    for name, level in _STARTED_WITH.items():
        logging.getLogger(name).setLevel(level)
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in _HANDLERS_STARTED_WITH and type(handler).__module__ != "_pytest.logging":
            root.removeHandler(handler)


@pytest.fixture
def two_cpus(monkeypatch):
    """Lets `prepare_workers` 2 start 2 processes here, whatever this machine's CPUs and however small the data."""
    from trainer.core.cpus import CpuBudget
    from trainer.data import writers

    monkeypatch.setattr(writers, "MIN_EXAMPLES_PER_PREPARE_WORKER", 1)
    monkeypatch.setattr(writers, "cpu_budget", lambda: CpuBudget(2.0, "test"))
