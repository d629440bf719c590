"""The training core in this process: the runner with a one-device strategy, a few dozen real digits, and its seams."""

import numpy as np
import pytest
import tensorflow as tf

from trainer.config.contract import DataConfig, OptimConfig, RuntimeConfig, TrainConfig
from trainer.core.errors import UsageError
from trainer.data import sources
from trainer.evaluation.metrics import evaluate
from trainer.records.history import History
from trainer.training import mirrored


def ONE_DEVICE():  # noqa: N802 - reads as the strategy it builds
    """A one-device strategy BackupAndRestore accepts (it refuses OneDeviceStrategy)."""
    return tf.distribute.MirroredStrategy(["/cpu:0"])


@pytest.fixture(scope="module")
def few_digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("few") / "data")
    sources.run(DataConfig(source="sample", max_train_examples=96, max_test_examples=48, num_shards=2), out)
    return out


def _config(data_dir, model_dir, **optim):
    return TrainConfig(
        RuntimeConfig(data_dir=data_dir, model_dir=str(model_dir), run_id="in-process"),
        data=DataConfig(shuffle_buffer=96),
        optim=OptimConfig(**{"batch_size": 16, **optim}),
    )


def test_one_device_training_writes_the_model_and_the_loss_falls(few_digits, tmp_path):
    config = _config(few_digits, tmp_path / "model", epochs=6, steps_per_execution=3, learning_rate=0.003)
    history = mirrored.run(config, None, strategy=ONE_DEVICE())
    losses = [e["loss"] for e in history.epochs]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0], losses
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == ["history.json", "model.keras", "saved_model"]
    assert History.read(str(tmp_path / "model")) == history
    assert history.workers == 1 and history.steps_per_epoch == 6 and history.run_id == "in-process"
    metrics = evaluate(str(tmp_path / "model"), few_digits)
    assert metrics.num_examples == 48 and metrics.accuracy > 0.1
    assert not (tmp_path / "model.backup").exists(), "the checkpoint directory is removed after a successful run"


def test_the_datasets_seam_trains_on_what_it_is_given(few_digits, tmp_path):
    images = np.zeros((16, 28, 28, 1), np.float32)
    labels = np.full((16,), 3, np.int64)
    constant = tf.data.Dataset.from_tensors((images, labels)).repeat()
    config = _config(few_digits, tmp_path / "model", epochs=2, steps_per_epoch=5, learning_rate=0.01)
    history = mirrored.run(config, None, datasets=constant, strategy=ONE_DEVICE())
    assert history.epochs[-1]["accuracy"] == 1.0, "it learned the one constant label it was fed"


def test_a_ps_cluster_is_refused_by_the_mirrored_runner(few_digits, tmp_path):
    tf_config = {"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, "task": {"type": "chief", "index": 0}}
    with pytest.raises(UsageError, match="TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored"):
        mirrored.run(_config(few_digits, tmp_path / "m"), tf_config)
