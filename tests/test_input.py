"""The training input pipeline on the real sample shards: epochs shorter than the data are served from memory."""

import shutil

import numpy as np
import tensorflow as tf

from trainer.config.contract import DataConfig
from trainer.data.inputs import train_dataset
from trainer.data.tfrecords import load_metadata, shard_paths


def _batches(data_dir: str, steps: int, epochs: int) -> tuple:
    meta = load_metadata(data_dir)
    dataset = train_dataset(data_dir, meta, DataConfig(shuffle_buffer=1000), 50, steps, 1, 0, 0)
    return iter(dataset), shard_paths(data_dir, meta, "train")


def test_short_epochs_decode_the_files_once(sample_data, tmp_path):
    data = str(tmp_path / "data")
    shutil.copytree(sample_data, data)
    steps, epochs = 10, 4  # 500 of the 4,000 training examples per epoch, shuffled 1,000 at a time
    iterator, files = _batches(data, steps, epochs)
    first_epoch = [next(iterator) for _ in range(steps)]
    for path in files:
        tf.io.gfile.remove(path)
    later_epochs = [next(iterator) for _ in range((epochs - 1) * steps)]

    reference, _ = _batches(sample_data, steps, epochs)
    for got, want in zip(first_epoch + later_epochs, [next(reference) for _ in range(epochs * steps)], strict=True):
        np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
        np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
    labels = [
        np.concatenate([b[1].numpy() for b in later_epochs[i * steps : (i + 1) * steps]]) for i in range(epochs - 1)
    ]
    assert not np.array_equal(labels[0], labels[1]), "every epoch is shuffled with its own seed"
    assert first_epoch[0][0].shape == (50, 28, 28, 1) and first_epoch[0][0].dtype == tf.float32


def test_the_stream_is_declared_endless(sample_data):
    """A finite or unknown cardinality makes MultiWorkerMirroredStrategy all-reduce a has-data flag before every "
    "step."""
    meta = load_metadata(sample_data)
    dataset = train_dataset(sample_data, meta, DataConfig(), 50, 10, 2, 1, 0)
    assert dataset.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    assert len(list(dataset.take(3 * 10))) == 30, "more batches than the configured epochs hold"
