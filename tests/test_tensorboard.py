"""TensorBoard event files of real training runs, read back with TensorBoard's own reader (EventAccumulator)."""

import json
import math
from pathlib import Path

import pytest

from tests.support.processes import UNDISTURBED_EPOCHS, run_module
from tests.support.tensorboard import TRAIN_TAGS, read_scalars


def _train(data, out, *extra):
    trainer = ["--data", data, "--model-dir", str(out / "model"), "--steps-per-epoch", "4", "--run-id", "run-7"]
    return run_module("trainer.train", *trainer, "--tensorboard-dir", str(out / "tb"), *extra)


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


@pytest.mark.slow  # the shared 2-worker run
def test_two_workers_only_the_chief_writes_and_without_validation_there_is_no_validation_run(
    undisturbed_two_workers, undisturbed_tensorboard
):
    """The 2-worker launch of `undisturbed_two_workers` (no --validate), which several files check."""
    result = undisturbed_two_workers[2]
    assert result.returncode == 0, result.stderr[-3000:]
    tensorboard = Path(undisturbed_tensorboard)
    files = sorted(tensorboard.rglob("events.out.tfevents.*"))
    assert [f.parent.relative_to(tensorboard).as_posix() for f in files] == ["undisturbed/train"], "one writer"
    assert sorted(p.name for p in (tensorboard / "undisturbed").iterdir()) == ["train"], "no validation run"
    scalars = read_scalars(tensorboard / "undisturbed" / "train")
    assert set(scalars) == TRAIN_TAGS
    assert all([step for step, _ in points] == list(range(1, UNDISTURBED_EPOCHS + 1)) for points in scalars.values())
