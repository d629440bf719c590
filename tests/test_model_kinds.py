"""Model kinds and the dataset's metadata: the trainer never asks which kind it has, and metadata.json is one record.

The whole train loop (`trainer.training.mirrored.run`) and the evaluate step run in this process on a third kind
defined here in a few lines; the dataset metadata reads the files every format writes and refuses bad content.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest

from trainer.config.contract import ModelConfig, TrainConfig
from trainer.core.errors import UsageError
from trainer.modeling import kinds
from trainer.modeling.kind import ModelKind
from trainer.records.dataset import DatasetMetadata

ROOT = Path(__file__).resolve().parents[1]
TINY = "tests.tiny:model"


class Tiny(ModelKind):
    """A third kind: a softmax regression on the images, compiled here, evaluated and served as a model_fn's is."""

    name = "the tiny model"

    @classmethod
    def claims(cls, model):
        return model.model_fn == TINY

    @classmethod
    def of(cls, model):
        return cls()

    def build(self, reader, compiled, gate):
        import tf_keras as keras

        inputs = keras.Input(shape=reader.meta.image_shape, name="image")
        x = keras.layers.Flatten()(keras.layers.Rescaling(1.0 / 255)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(reader.meta.num_classes, activation="softmax")(x))
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return model

    def signatures(self, model):
        return None

    def evaluate(self, model_dir, data_dir, examples, split="test"):
        from trainer.evaluation.model_metrics import evaluate_model

        return evaluate_model(model_dir, data_dir, examples, split)

    def serving_check(self, saved_model_dir, sample):
        from trainer.serving import serving_check

        return serving_check.run_outputs(saved_model_dir, sample.features, sample.predictions)


@pytest.fixture
def tiny(monkeypatch):
    """The kinds with Tiny first: the only change a third kind makes outside its own module."""
    builtin = kinds.kinds
    monkeypatch.setattr(kinds, "kinds", lambda: (Tiny, *builtin()))


def test_the_train_loop_and_the_evaluate_step_run_a_third_kind_without_asking_which_it_is(tiny, sample_data, tmp_path):
    import tensorflow as tf

    from trainer import steps
    from trainer.records.history import History
    from trainer.training import mirrored

    model_dir = tmp_path / "model"
    config = TrainConfig.from_settings(
        data_dir=sample_data, model_dir=str(model_dir), model_fn=TINY, run_id="tiny-1", epochs=2, batch_size=32,
        steps_per_epoch=8, validate=True, learning_rate=0.5, checkpoint_dir=str(tmp_path / "checkpoints"),
    )  # fmt: skip
    history = mirrored.run(config, None)

    assert [e["epoch"] for e in history.epochs] == [1, 2] and all("val_accuracy" in e for e in history.epochs)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"], "it trained"
    written = History.read(str(model_dir))
    assert written.config == config.to_dict(), "the history records the whole configuration"
    assert written.parameters["learning_rate"] == pytest.approx(0.05), "the rate the model compiled, not the setting"
    assert written.parameters["epochs"] == 2 and written.model_fn == TINY
    served = tf.saved_model.load(str(model_dir / "saved_model")).signatures["serving_default"]
    assert served.structured_input_signature[1]["image"].shape.as_list() == [None, 28, 28, 1], "its own signature"

    verdict = steps.evaluate(
        sample_data, [str(model_dir)], str(tmp_path / "report.html"), str(tmp_path / "copy"), 0.5, "accuracy>=0.5"
    )
    assert verdict.evaluation.num_examples == 1000 and verdict.evaluation.scalars()["accuracy"] > 0.5
    assert verdict.serving_check.passed, verdict.serving_check.reason
    assert verdict.decision == "publish"
    assert "the tiny model" in (tmp_path / "report.html").read_text()


def test_the_kind_is_chosen_from_the_model_settings_and_refuses_what_it_cannot_honour():
    assert kinds.choose(ModelConfig()).name == "the built-in CNN"
    assert kinds.choose(ModelConfig(model_fn="a.b:c")).name == "model_fn 'a.b:c'"
    with pytest.raises(UsageError, match=r"^source 'fn:m:f' is not allowed without model_fn"):
        kinds.choose(ModelConfig()).check_settings(source="fn:m:f")
    with pytest.raises(UsageError, match=r"^model_fn 'a.b:c' is not allowed with strategy 'parameter_server'"):
        kinds.choose(ModelConfig(model_fn="a.b:c")).check_settings(strategy="parameter_server")
    kinds.choose(ModelConfig(model_fn="a.b:c")).check_settings(source="fn:m:f", gate="auc>=0.9")


def test_nothing_outside_the_kinds_asks_whether_the_model_is_a_model_fn():
    found = subprocess.run(
        ["grep", "-rnE", r"model_fn|is_saved\(|image_shape is None", "trainer", "pipelines", "--include=*.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    branches = [line for line in found if re.search(r"\bif\b|\belse\b", line.split(":", 2)[2])]
    choice = ("trainer/modeling/user.py", "trainer/modeling/kinds.py")
    outside = [line for line in branches if not line.startswith(choice)]
    assert outside == []
    assert not re.findall(r'meta\["', "".join(p.read_text() for p in (ROOT / "trainer").rglob("*.py")))


def test_metadata_json_reads_back_as_written_in_both_formats(sample_data, tmp_path):
    from trainer.config.contract import DataConfig
    from trainer.data import sources

    on_disk = json.loads((Path(sample_data) / "metadata.json").read_text())
    images = DatasetMetadata.read(sample_data)
    assert images.to_json() == on_disk and "format" not in on_disk
    assert images.image_shape == (28, 28, 1) and images.num_classes == 10 and images.num_examples("train") == 4000

    saved = sources.run(DataConfig(source="fn:tests.user_code.regression:datasets"), str(tmp_path / "fn"))
    on_disk = json.loads((tmp_path / "fn" / "metadata.json").read_text())
    assert DatasetMetadata.read(str(tmp_path / "fn")).to_json() == on_disk == saved.to_json()
    assert on_disk["format"] == "tf.data" and saved.image_shape is None and saved.num_classes == 0
    assert saved.splits["train"].directory == "train"


def test_an_old_metadata_file_without_the_newer_keys_still_reads(sample_data, tmp_path):
    old = json.loads((Path(sample_data) / "metadata.json").read_text())
    del old["created_by"], old["source"]
    (tmp_path / "metadata.json").write_text(json.dumps({**old, "comment": "an unknown key is left alone"}))
    meta = DatasetMetadata.read(str(tmp_path))
    assert meta.source is None and meta.created_by == "" and meta.class_names == tuple("0123456789")


@pytest.mark.parametrize(
    "content, line",
    [
        ("[1, 2]", "is not a JSON object"),
        ('{"format": "parquet"}', "lacks format_version, image_shape, num_classes, class_names, splits"),
        ('{"format": "tf.data", "splits": {"train": {}}}', "splits {'train': {}} is not allowed; allowed: train and"),
        ("{", "is not valid JSON"),
    ],
)
def test_bad_metadata_is_refused_in_one_line_naming_the_file(tmp_path, content, line):
    (tmp_path / "metadata.json").write_text(content)
    with pytest.raises(UsageError) as err:
        DatasetMetadata.read(str(tmp_path))
    assert str(err.value).startswith(f"dataset metadata {str(tmp_path / 'metadata.json')!r}")
    assert line in str(err.value) and "\n" not in str(err.value)
