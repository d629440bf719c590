"""TensorBoard event files of real training runs, read back with TensorBoard's own reader (EventAccumulator)."""

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from tests.conftest import run_module

TRAIN_TAGS = {"loss", "accuracy", "learning_rate", "examples_per_second"}


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of one TensorBoard run directory, as TensorBoard's scalar plugin would load it."""
    accumulator = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["tensors"]:
        assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag
        scalars[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in accumulator.Tensors(tag)]
    return scalars


def _train(data, out, *extra, launcher=()):
    trainer = ["--data", data, "--model-dir", str(out / "model"), "--steps-per-epoch", "4", "--run-id", "run-7"]
    args = [*trainer, "--tensorboard-dir", str(out / "tb"), *extra]
    return run_module("trainer.launch", *launcher, "--", *args) if launcher else run_module("trainer.train", *args)


@pytest.mark.slow
def test_one_point_per_epoch_for_each_scalar_equal_to_the_history(sample_data, tmp_path):
    result = _train(sample_data, tmp_path, "--epochs", "3", "--validate")
    assert result.returncode == 0, result.stderr[-3000:]
    history = json.loads((tmp_path / "model" / "history.json").read_text())
    run = tmp_path / "tb" / "run-7"
    assert history["tensorboard"] == str(run)
    train, validation = read_scalars(run / "train"), read_scalars(run / "validation")
    assert set(train) == TRAIN_TAGS and set(validation) == {"loss", "accuracy"}
    for scalars in (train, validation):
        assert all([step for step, _ in points] == [1, 2, 3] for points in scalars.values()), scalars
    epochs = history["epochs"]
    for tag in ("loss", "accuracy", "examples_per_second"):
        assert [v for _, v in train[tag]] == pytest.approx([e[tag] for e in epochs], rel=1e-6), tag
    for tag in ("loss", "accuracy"):
        assert [v for _, v in validation[tag]] == pytest.approx([e[f"val_{tag}"] for e in epochs], rel=1e-6), tag
    steps, total = history["steps_per_epoch"], 3 * history["steps_per_epoch"]

    def cosine(step):  # CosineDecay(peak, total, alpha=0.05), as trainer.model builds it
        return history["learning_rate"] * (0.95 * 0.5 * (1 + math.cos(math.pi * step / total)) + 0.05)

    assert [v for _, v in train["learning_rate"]] == pytest.approx([cosine(k * steps) for k in (1, 2, 3)], rel=1e-5)


@pytest.mark.slow
def test_without_validation_there_is_no_validation_run(sample_data, tmp_path):
    result = _train(sample_data, tmp_path, "--epochs", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "tb" / "run-7").iterdir()) == ["train"]


@pytest.mark.slow
def test_two_workers_only_the_chief_writes(sample_data, tmp_path):
    result = _train(sample_data, tmp_path, "--epochs", "2", launcher=("--workers", "2"))
    assert result.returncode == 0, result.stderr[-3000:]
    files = sorted((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert [f.parent.relative_to(tmp_path / "tb").as_posix() for f in files] == ["run-7/train"], "one writer: the chief"
    scalars = read_scalars(tmp_path / "tb" / "run-7" / "train")
    assert set(scalars) == TRAIN_TAGS
    assert all([step for step, _ in points] == [1, 2] for points in scalars.values())
