"""The serving check on real exported SavedModels: one the trainer's exporter wrote, and broken ones.

Each check starts a fresh process that loads the SavedModel through TensorFlow's session loader and answers TF
Serving's REST API on loopback; nothing in TensorFlow is mocked.
"""

import dataclasses

import numpy as np
import pytest
from kfp.dsl import HTML, ClassificationMetrics, Dataset, Metrics, Model

import components
from pipelines.local_run import publish_summary
from trainer.config.gate import Gate
from trainer.data.tfrecords import read_arrays
from trainer.evaluation import metrics
from trainer.evaluation.metrics import compute_metrics
from trainer.evaluation.verdict import Verdict
from trainer.modeling.cnn import BuiltInCnn, build_model, serving_function
from trainer.modeling.export import save_model
from trainer.records.history import History
from trainer.serving import serving_check
from trainer.serving.serving_check import Check, ServingCheck

SHAPE = (28, 28, 1)
ROWS = 64
HISTORY = History(
    epochs=({"epoch": 1, "loss": 2.3, "accuracy": 0.1, "examples_per_second": 100.0},),
    workers=1,
    strategy="multi_worker_mirrored",
    global_batch_size=64,
    steps_per_epoch=1,
    learning_rate=0.002,
    dataset="sample",
    class_names=tuple("0123456789"),
    image_shape=SHAPE,
    run_id="run-7",
    tensorboard="",
    parameters={},
)


def _model(seed=1):
    import tf_keras as keras

    keras.utils.set_random_seed(seed)
    return build_model(SHAPE, 10, 0.002)


def _export(directory, model=None):
    save_model(model or _model(), BuiltInCnn(), str(directory), HISTORY)
    return directory / "saved_model"


@pytest.fixture(scope="module")
def held_out(sample_data):
    images, _, _ = read_arrays(sample_data, "test")
    return images[:ROWS]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("exported") / "model")


def _failed(result, check):
    assert not result.passed
    failed = [c for c in result.checks if not c.passed]
    assert failed[0].name == check, result.checks
    assert result.reason == f"{check}: {failed[0].detail}" and result.summary == f"failed: {result.reason}"
    return failed[0].detail


def test_a_model_the_trainer_exported_passes_every_check(exported, held_out):
    result = serving_check.run(str(exported), held_out, metrics.predict(str(exported), held_out))
    assert result.passed, result.checks
    assert [c.name for c in result.checks] == [
        "loads",
        "signature",
        "response",
        "shapes and dtypes",
        "probabilities sum to 1",
        "class_ids are the argmax",
        "agrees with the evaluation",
    ]
    assert result.checks[1].detail.startswith("serving_default: images DT_UINT8 [-1, 28, 28] -> probabilities")
    assert result.summary.startswith(f"passed: {ROWS} held-out uint8 images as TF Serving REST instances")


def test_predictions_that_differ_from_the_evaluation_fail(exported, held_out):
    other = _export(exported.parent.parent / "other", _model(seed=2))
    detail = _failed(
        serving_check.run(str(exported), held_out, metrics.predict(str(other), held_out)), "agrees with the evaluation"
    )
    assert "largest probability difference" in detail


def test_nan_outputs_fail_the_probability_check(tmp_path, held_out):
    model = _model()
    dense = model.get_layer("probabilities")
    dense.set_weights([np.full_like(w, np.nan) for w in dense.get_weights()])
    path = _export(tmp_path / "nan", model)
    detail = _failed(
        serving_check.run(str(path), held_out, metrics.predict(str(path), held_out)), "probabilities sum to 1"
    )
    assert detail.startswith(f"{ROWS} of {ROWS} rows are not (non-finite: {ROWS})")


def test_a_model_without_serving_default_fails_with_the_signatures_it_has(tmp_path, held_out):
    import tensorflow as tf

    model = _model()
    tf.saved_model.save(model, str(tmp_path / "saved_model"), signatures={"predict": serving_function(model, SHAPE)})
    expected = np.full((ROWS, 10), 0.1)
    detail = _failed(serving_check.run(str(tmp_path / "saved_model"), held_out, expected), "signature")
    assert detail == "no serving_default signature; the model has ['predict']"


def test_a_signature_on_float_images_is_not_the_serving_contract(tmp_path, held_out):
    import tensorflow as tf

    model = _model()

    @tf.function(input_signature=[tf.TensorSpec([None, 28, 28], tf.float32, name="images")])
    def serve(images):
        probabilities = model(images[..., tf.newaxis], training=False)
        return {"probabilities": probabilities, "class_ids": tf.argmax(probabilities, axis=-1)}

    tf.saved_model.save(model, str(tmp_path / "saved_model"), signatures={"serving_default": serve})
    detail = _failed(serving_check.run(str(tmp_path / "saved_model"), held_out, np.full((ROWS, 10), 0.1)), "signature")
    assert detail == "input images is DT_FLOAT [-1, 28, 28], not raw DT_UINT8 images [-1, 28, 28]"


def test_a_model_that_does_not_load_fails_with_the_loaders_error(exported, tmp_path, held_out):
    import shutil

    broken = tmp_path / "saved_model"
    shutil.copytree(exported, broken)
    (broken / "saved_model.pb").write_bytes((exported / "saved_model.pb").read_bytes()[:300])
    detail = _failed(serving_check.run(str(broken), held_out, np.full((ROWS, 10), 0.1)), "loads")
    assert detail.startswith("the model did not load in a fresh process (exit 1): error: ")


@pytest.mark.slow  # a SavedModel served in a fresh process
def test_the_evaluate_step_reports_a_failed_check_and_says_why(sample_data, tmp_path):
    model = _model()
    dense = model.get_layer("probabilities")
    dense.set_weights([np.full_like(w, np.nan) for w in dense.get_weights()])
    _export(tmp_path / "worker-0", model)
    outputs = {
        "metrics": Metrics(uri=str(tmp_path / "metrics")),
        "report": HTML(uri=str(tmp_path / "report")),
        "classification_metrics": ClassificationMetrics(uri=str(tmp_path / "cm")),
        "chief_model": Model(uri=str(tmp_path / "chief")),
    }
    ops = components.build("registry.example.com/team/kfp-tf-multiworker:9.9.9")
    decision, accuracy, verdict = ops.evaluate.python_func(
        dataset=Dataset(uri=sample_data), models=[Model(uri=str(tmp_path / "worker-0"))], min_accuracy=0.0, **outputs
    )
    assert verdict.startswith(f"failed: probabilities sum to 1: {serving_check.EXAMPLES} of {serving_check.EXAMPLES}")
    assert outputs["metrics"].metadata["serving_check_passed"] == 0 and outputs["metrics"].metadata["passed_gate"] == 1
    report = (tmp_path / "report").read_text()
    assert f"Serving check: <b>FAILED, not published ({verdict[len('failed: ') :]})</b>" in report
    assert outputs["chief_model"].metadata["serving_check"] == verdict and 0 <= accuracy <= 1
    assert decision == f"hold: the serving check {verdict}", "the gate's condition sees it"
    assert publish_summary("run-7", decision, outputs["metrics"].metadata, "/published") == (
        f"not published: the serving check {verdict}"
    )


def test_the_decision_names_every_reason_to_hold():
    reason = "signature: no serving_default signature; the model has []"
    failed = ServingCheck(False, f"failed: {reason}", reason, (Check("signature", False, reason[11:]),), 8, 1.0)
    results = compute_metrics(np.array([[0.9, 0.1]] * 9 + [[0.1, 0.9]]), np.array([0] * 9 + [0]), ["a", "b"])
    assert results.accuracy == 0.9
    assert Verdict(results, Gate.of("", 0.95), failed).decision == (
        "hold: accuracy 0.9000 is below the gate 0.9500; the serving check failed: signature: no serving_default "
        "signature; the model has []"
    )
    passed = dataclasses.replace(failed, passed=True, reason="", summary="passed: ...")
    assert Verdict(results, Gate.of("", 0.9), passed).decision == "publish"
    assert Verdict(results, Gate.of("loss<=0.1", 0.9), passed).decision == (
        f"hold: loss {results.loss:.4f} is above the gate 0.1000"
    )
    assert Verdict(results, Gate.of("", 0.9), passed).metrics() == {
        "accuracy": 0.9,
        "loss": results.loss,
        "gate_threshold": 0.9,
        "passed_gate": 1,
        "serving_check_passed": 1,
        "test_examples": 10,
    }
