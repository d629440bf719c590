"""Module mode: your own data function (`source` 'fn:...') and model function (`model_fn`) through our runner,
checkpoints, evaluation, gate (any metric, either direction), serving check and publishing.

The fast tests run one process on a regression module with two named inputs (tests/user_code/regression.py) and
bad functions (tests/user_code/bad.py); the slow one runs the tabular example's module through the pipeline on 2
workers (kfp.local), kills a worker mid-training and compares with the same runner's single-process baseline.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from tests.support.processes import Streamed, child_env, run_module, worker_process
from tests.support.tabular import AUC_MARGIN, EPOCHS, GLOBAL_BATCH
from trainer.config.contract import DataConfig, ModelConfig, PublishConfig, TrainConfig
from trainer.config.gate import Gate
from trainer.core.errors import UsageError

REGRESSION = "tests.user_code.regression"
EXAMPLE = ROOT / "pipelines" / "tabular_example"


@pytest.mark.parametrize(
    "text, gate",
    [
        ("", Gate("accuracy", True, 0.9)),
        ("auc>=0.98", Gate("auc", True, 0.98)),
        (" loss <= 0.1 ", Gate("loss", False, 0.1)),
        ("mae<=1e-2", Gate("mae", False, 0.01)),
    ],
)
def test_the_gate_takes_a_metric_and_a_direction_from_its_setting(text, gate):
    assert Gate.of(PublishConfig(gate=text).gate, 0.9) == gate


def test_a_gate_ranks_and_fails_in_its_own_direction():
    loss = Gate.of("loss<=0.1", 0)
    assert loss.passes({"loss": 0.1}) and not loss.passes({"loss": 0.11})
    assert loss.worse(0.2, than=0.1) and not loss.worse(0.05, than=0.1)
    assert loss.failure({"loss": 0.25}) == "loss 0.2500 is above the gate 0.1000"
    auc = Gate.of("auc>=0.98", 0)
    assert auc.worse(0.9, than=0.95) and auc.failure({"auc": 0.9}) == "auc 0.9000 is below the gate 0.9800"
    with pytest.raises(UsageError, match=r"^gate 'f1 >= 0.9' names metric 'f1'; allowed: .*: auc, loss$"):
        Gate.of("f1>=0.9", 0).passes({"loss": 0.1, "auc": 0.9})


@pytest.mark.parametrize(
    "group, name, value, allowed",
    [
        (PublishConfig, "gate", "auc > 0.9", "empty (accuracy >= min_accuracy), or METRIC>=VALUE or METRIC<=VALUE"),
        (PublishConfig, "gate", ">=0.9", "empty (accuracy >= min_accuracy)"),
        (ModelConfig, "model_fn", "diagnosis", "empty or package.module:function"),
        (ModelConfig, "model_fn", "diagnosis:model:x", "empty or package.module:function"),
        (DataConfig, "source", "fn:diagnosis", "'sample', 'idx:DIR_OR_URI', a TFDS name"),
    ],
)
def test_a_setting_naming_your_code_is_checked_when_given(group, name, value, allowed):
    with pytest.raises(UsageError) as err:
        group(**{name: value})
    assert str(err.value).startswith(f"{name} {value!r} is not allowed; allowed: {allowed}")


@pytest.mark.parametrize(
    "function, message",
    [
        ("no_such_module:datasets", "module 'no_such_module' cannot be imported"),
        ("tests.user_code.bad:missing", "module 'tests.user_code.bad' has no function 'missing'"),
        ("tests.user_code.bad:not_a_function", "has no function 'not_a_function'"),
        ("tests.user_code.bad:a_list", "returned list for split 'train'; allowed: a tf.data.Dataset"),
        ("tests.user_code.bad:single_tensors", "for split 'train'; allowed: (features, label) pairs"),
        ("tests.user_code.bad:endless", "returned an endless dataset for split 'train'; allowed: a finite one"),
        ("tests.user_code.bad:different_splits", "allowed: the same features and label for both"),
        ("tests.user_code.bad:empty_test", "returned no examples for split 'test'; allowed: at least 1"),
        ("tests.user_code.bad:raising", "failed when called with ('train'): ValueError: no data for train today"),
        (
            "tests.user_code.broken_import:datasets",
            "importing module 'tests.user_code.broken_import' failed: RuntimeError: this module needs a database",
        ),
    ],
)
def test_a_data_function_that_does_not_give_finite_pairs_is_refused_and_nothing_is_written(function, message, tmp_path):
    from trainer.data import sources

    with pytest.raises(UsageError) as err:
        sources.run(DataConfig(source=f"fn:{function}"), str(tmp_path / "data"))
    assert message in str(err.value) and function in str(err.value)
    assert not (tmp_path / "data").exists()
    assert [p.name for p in tmp_path.iterdir()] == [], "no half-written temporary directory either"


def test_trainer_prepare_refuses_a_module_it_cannot_import_in_one_line(tmp_path):
    result = run_module("trainer.prepare", "--source", "fn:no_such_module:datasets", "--output", str(tmp_path / "d"))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith("error: source 'fn:no_such_module:datasets': module 'no_such_module' cannot be")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "function, message",
    [
        ("uncompiled", "returned a model that is not compiled; allowed: a model after model.compile("),
        ("keras3", "returned keras.src.models.sequential.Sequential; allowed: a tf_keras.Model"),
    ],
)
def test_a_model_function_must_return_a_compiled_tf_keras_model(function, message):
    import tensorflow as tf

    from tests.user_code import bad
    from trainer.modeling.user import build_user_model

    with pytest.raises(UsageError) as err:
        build_user_model(getattr(bad, function), f"tests.user_code.bad:{function}", tf.TensorSpec((3,), tf.float32))
    assert str(err.value).startswith(f"model_fn 'tests.user_code.bad:{function}' {message}")


def _trained(base, data_fn, model_fn, epochs):
    """`data_fn` prepared into base/data and `model_fn` trained on it by our runner in this process (base/model)."""
    from trainer.data import sources
    from trainer.train import run

    data, model = base / "data", base / "model"
    sources.run(DataConfig(source=f"fn:{REGRESSION}:{data_fn}"), str(data))
    config = TrainConfig.from_settings(
        data_dir=str(data), model_dir=str(model), model_fn=f"{REGRESSION}:{model_fn}", epochs=epochs, batch_size=32
    )
    assert run(config, None) == 0
    return str(data), str(model)


def _evaluated(base, data, model, gate):
    from trainer import steps

    return steps.evaluate(data, [model], str(base / "report.html"), str(base / "copy"), 0.95, gate)


@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    """The regression module prepared, trained in one process by our runner and evaluated behind 'mae<=0.2'."""
    base = tmp_path_factory.mktemp("module")
    return base, _evaluated(base, *_trained(base, "datasets", "model", 40), "mae<=0.2")


def test_every_worker_reads_the_examples_in_the_order_the_function_gave_them(regression):
    from tests.user_code.regression import datasets
    from trainer.data import user_source
    from trainer.data.tfrecords import load_metadata

    data = str(regression[0] / "data")
    for split in ("train", "test"):
        saved = list(user_source.load_split(data, load_metadata(data), split).as_numpy_iterator())
        given = list(datasets(split).as_numpy_iterator())
        assert len(saved) == len(given) == {"train": 512, "test": 128}[split]
        assert all(a[1] == b[1] and (a[0]["b"] == b[0]["b"]).all() for a, b in zip(saved, given, strict=True))


def test_your_model_on_your_data_is_trained_evaluated_on_its_own_metrics_and_served(regression):
    base, verdict = regression
    results = verdict.evaluation
    assert sorted(results.metrics) == ["loss", "mae"] and results.num_examples == 128
    assert results.metrics["mae"] < 0.2 and verdict.passed_gate and verdict.decision == "publish"
    check = verdict.serving_check
    assert check.passed, check.summary
    assert [c.name for c in check.checks] == [
        "loads",
        "signature",
        "response",
        "shapes and dtypes",
        "agrees with the evaluation",
    ]
    assert check.checks[1].detail == "serving_default: a [-1], b [-1, 2] -> y", "the model's own named inputs"
    assert check.examples == 128, "every held-out example (fewer than serving_check.EXAMPLES) as named instances"
    assert verdict.metrics() == {
        **results.metrics,
        "gate_threshold": 0.2,
        "passed_gate": 1,
        "serving_check_passed": 1,
        "test_examples": 128,
    }
    report = (base / "report.html").read_text()
    assert "Quality gate (mae &lt;= 0.2): <b>passed</b>" in report
    assert f"test mae {results.metrics['mae']:.4f}" in report
    assert "Confusion matrix" not in report, "no classification tables for a regression"
    history = json.loads((base / "model" / "history.json").read_text())
    assert history["model_fn"] == f"{REGRESSION}:model" and history["dataset"] == f"fn:{REGRESSION}:datasets"
    assert len(history["epochs"]) == 40 and "mae" in history["epochs"][-1]


def test_a_model_failing_its_gate_in_its_direction_is_held(regression):
    from trainer.evaluation.verdict import Verdict

    _, verdict = regression
    strict = Verdict(verdict.evaluation, Gate.of("mae<=0.0001", 0), verdict.serving_check)
    assert strict.decision == f"hold: mae {verdict.evaluation.metrics['mae']:.4f} is above the gate 0.0001"


def test_a_metric_that_is_not_a_number_holds_the_model_and_stays_out_of_the_metrics_artifact():
    from trainer.evaluation.model_metrics import ModelEvaluation
    from trainer.evaluation.verdict import Verdict
    from trainer.serving.serving_check import ServingCheck

    diverged = ModelEvaluation({"loss": float("nan"), "mae": 0.1}, 128)
    check = ServingCheck(True, "passed: ...", "", (), 128, 1.0)
    verdict = Verdict(diverged, Gate.of("loss<=0.5", 0), check)
    assert verdict.decision == "hold: loss is nan (the model diverged), not a number the gate 0.5000 takes"
    assert "loss" not in verdict.metrics() and verdict.metrics()["mae"] == 0.1
    assert Verdict(diverged, Gate.of("mae<=0.5", 0), check).decision == "publish"


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    """A model with two outputs listed in an order their names do not sort in, one with a per-class F1."""
    base = tmp_path_factory.mktemp("two-heads")
    return _evaluated(base, *_trained(base, "two_heads_data", "two_heads", 10), "y_value_mae<=1.0")


def test_a_model_with_two_outputs_is_served_and_compared_output_by_output(two_heads):
    metrics = two_heads.evaluation.metrics
    assert sorted(metrics) == ["a_positive_loss", "loss", "y_value_loss", "y_value_mae"], "no vector-valued F1"
    check = two_heads.serving_check
    assert check.passed, check.summary
    assert check.checks[1].detail == "serving_default: a [-1], b [-1, 2] -> a_positive, y_value"
    assert check.checks[3].detail == "a_positive [128, 1], y_value [128, 1]"


def test_a_model_whose_metric_is_named_like_the_steps_own_records_is_refused(tmp_path):
    base = tmp_path
    data, model = _trained(base, "datasets", "colliding", 1)
    with pytest.raises(UsageError) as err:
        _evaluated(base, data, model, "loss<=1")
    assert str(err.value) == (
        f"model_fn '{REGRESSION}:colliding' compiles metrics named test_examples, which the evaluate step records for "
        "itself; allowed: other names (metrics=[...(name=...)])"
    )


def test_the_serving_check_fails_a_saved_model_whose_answers_differ_from_the_keras_models(regression):
    from trainer.data import user_source
    from trainer.data.tfrecords import load_metadata
    from trainer.serving.serving_check import run_outputs

    base, verdict = regression
    data = str(base / "data")
    features = next(iter(user_source.load_split(data, load_metadata(data), "test").batch(8)))[0]
    features = {name: value.numpy() for name, value in features.items()}
    import tf_keras as keras

    keras_model = keras.models.load_model(base / "model" / "model.keras")
    expected = keras_model(features).numpy()
    check = run_outputs(str(base / "model" / "saved_model"), features, {"y": expected + 0.01})
    assert not check.passed and check.reason.startswith("agrees with the evaluation: all values finite: True; ")
    missing = run_outputs(str(base / "model" / "saved_model"), {"a": features["a"]}, {"y": expected})
    assert missing.reason == "signature: inputs are ['a', 'b'], the features are ['a']"


def test_a_published_model_is_replaced_only_by_a_better_one_in_the_gates_direction(regression, tmp_path):
    from trainer import steps

    base, verdict = regression
    metrics, uri = verdict.metrics(), str(tmp_path / "published")
    first = steps.publish_model(str(base / "copy"), metrics, uri, gate="mae<=0.2")
    assert first.published and first.reason.endswith("(first version)")
    worse = steps.publish_model(str(base / "copy"), {**metrics, "mae": metrics["mae"] + 0.1}, uri, gate="mae<=0.2")
    assert not worse.published and worse.reason.startswith(f"not published: mae {metrics['mae'] + 0.1:.4f} is above")
    better = steps.publish_model(str(base / "copy"), {**metrics, "mae": metrics["mae"] / 2}, uri, gate="mae<=0.2")
    assert better.published
    from trainer.publishing.publish import latest

    assert latest(uri).lineage["model_fn"] == f"{REGRESSION}:model"


def test_the_built_in_cnn_refuses_data_from_a_function_and_model_fn_refuses_parameter_servers(regression, sample_data):
    from trainer.training.setup import prepare

    base, _ = regression
    config = TrainConfig.from_settings(data_dir=str(base / "data"), model_dir=str(base / "m2"))
    with pytest.raises(UsageError, match=r"prepared from source 'fn:tests.user_code.regression:datasets', whose"):
        prepare(config, chief=True)
    ps = TrainConfig.from_settings(
        data_dir=sample_data, model_dir=str(base / "m3"), model_fn=f"{REGRESSION}:model", strategy="parameter_server"
    )
    with pytest.raises(UsageError, match=r"^model_fn '.*' is not allowed with strategy 'parameter_server'; allowed: m"):
        prepare(ps, chief=True)


def test_trainer_evaluate_reports_a_model_fns_own_metrics(regression):
    base, verdict = regression
    result = run_module("trainer.evaluate", "--model-dir", str(base / "model"), "--data", str(base / "data"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == ", ".join(f"{k} {v:.4f}" for k, v in verdict.evaluation.metrics.items())


def test_the_compiled_pipeline_takes_model_fn_and_the_gate_as_string_parameters(compiled_yaml):
    from tests.support.pipelines import pipeline_spec

    spec = pipeline_spec(compiled_yaml["multi_worker_mirrored"])
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    for name in ("model_fn", "gate", "source"):
        assert parameters[name]["parameterType"] == "STRING"
    assert parameters["model_fn"]["defaultValue"] == "" and parameters["gate"]["defaultValue"] == ""
    tasks = spec["root"]["dag"]["tasks"]
    loop = tasks["for-loop-1"]["componentRef"]["name"]
    worker = spec["components"][loop]["dag"]["tasks"]["train-worker"]["inputs"]["parameters"]
    assert worker["model_fn"] == {"componentInputParameter": "pipelinechannel--model_fn"}
    assert tasks["evaluate"]["inputs"]["parameters"]["gate"] == {"componentInputParameter": "gate"}
    ps = pipeline_spec(compiled_yaml["parameter_server"])["root"]["inputDefinitions"]["parameters"]
    assert "gate" in ps and "model_fn" not in ps, "the parameter-server runner trains only the built-in CNN"


def _training_process(index: int) -> int | None:
    """The pid of our training process (python -m trainer.training.task) of worker INDEX, if one runs."""
    return worker_process(index, lambda argv: argv[1:3] == [b"-m", b"trainer.training.task"])


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The tabular example's module through our runner in one process: same data, epochs and global batch."""
    base = tmp_path_factory.mktemp("baseline")
    env = child_env({"PYTHONPATH": f"{EXAMPLE}{os.pathsep}{ROOT}"})
    source = ("--source", "fn:diagnosis:datasets", "--output", str(base / "data"))
    assert run_module("trainer.prepare", *source, env=env).returncode == 0
    train = run_module(
        "trainer.train", "--data", str(base / "data"), "--model-dir", str(base / "model"),
        "--model-fn", "diagnosis:model", "--epochs", EPOCHS, "--batch-size", str(GLOBAL_BATCH), env=env,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr[-3000:]
    evaluate = run_module("trainer.evaluate", "--model-dir", str(base / "model"), "--data", str(base / "data"), env=env)
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    return float(re.search(r"auc ([\d.]+)", evaluate.stdout).group(1))


@pytest.mark.slow
def test_the_example_module_on_two_workers_survives_a_killed_worker_and_reaches_its_baseline(baseline, tmp_path):
    from trainer.publishing.publish import latest

    published = tmp_path / "published"
    run = Streamed(
        [
            sys.executable, "pipelines/mnist.py", "--local", "--num-workers", "2", "--epochs", EPOCHS,
            "--source", "fn:diagnosis:datasets", "--model-fn", "diagnosis:model", "--gate", "auc>=0.98",
            "--publish-uri", str(published), "--output-dir", str(tmp_path / "out"),
        ],
        child_env({"PYTHONPATH": f"{EXAMPLE}{os.pathsep}{ROOT}"}),
    )  # fmt: skip
    code, _ = run.kill_once(r'"epoch": 2, ', lambda: _training_process(1))
    output = "\n".join(run.lines)
    assert code == 0, output[-5000:]
    assert "worker 1: restart 1 of 2 in place (exit code 137)" in output, output[-5000:]
    resumed = [int(n) for n in re.findall(r"continuing with epoch (\d+)", output)]
    assert len(resumed) >= 2 and min(resumed) >= 3, "both restarted workers resumed from a checkpoint, not epoch 1"
    version = latest(str(published))
    assert version is not None, output[-3000:]
    assert version.lineage["model_fn"] == "diagnosis:model" and version.lineage["dataset"] == "fn:diagnosis:datasets"
    auc = version.metrics["auc"]
    assert baseline >= 0.97 and auc >= baseline - AUC_MARGIN, (auc, baseline)
    assert re.search(r"^test metrics: .*auc 0\.9\d+", output, re.M) and "serving check: passed" in output
    print(f"\nmodule mode, tabular example: test AUC {auc:.4f} on 2 workers (1 killed), {baseline:.4f} in one process")


@pytest.mark.parametrize(("setting", "accepted"), [(None, True), ("0", False)], ids=["unset", "user-sets-0"])
def test_a_tf_keras_model_written_as_tf_keras_is_trainable_unless_the_user_chose_keras_3(setting, accepted):
    """`tf.keras` is tf-keras in a process of the trainer (`TF_USE_LEGACY_KERAS=1` set before TensorFlow is
    imported), so a model written as the TensorFlow tutorials write it is accepted; a user's own
    TF_USE_LEGACY_KERAS=0 is kept, and `tf.keras` is then Keras 3, refused."""
    code = (
        "import trainer, tensorflow as tf, sys\n"
        "from trainer.core.errors import UsageError\n"
        "from trainer.modeling.user import build_user_model\n"
        "def model_fn(features):\n"
        "    m = tf.keras.Sequential([tf.keras.Input(shape=features.shape), tf.keras.layers.Dense(1)])\n"
        "    m.compile(optimizer='adam', loss='mse')\n"
        "    return m\n"
        "try:\n"
        "    build_user_model(model_fn, 'tutorial:model_fn', tf.TensorSpec((3,), tf.float32))\n"
        "except UsageError as err:\n"
        "    sys.exit(f'refused: {err}')\n"
        "print('accepted', tf.keras.Sequential.__module__, 'keras.src' in sys.modules)\n"
    )
    env = child_env()
    env.pop("TF_USE_LEGACY_KERAS", None)
    if setting is not None:
        env["TF_USE_LEGACY_KERAS"] = setting
    command = [sys.executable, "-c", code]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if accepted:
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split() == ["accepted", "tf_keras.src.engine.sequential", "False"], "Keras 3 not loaded"
    else:
        assert result.returncode == 1
        assert "refused: model_fn 'tutorial:model_fn' returned keras.src.models.sequential.Sequential" in result.stderr
