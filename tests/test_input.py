"""The training input pipeline on the real sample shards: epochs shorter than the data are served from memory; a
share over the memory limit is cached on local disk, or read from the files every epoch."""

import shutil

import numpy as np
import pytest
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


def _epochs(data_dir: str, steps: int, where=None):
    meta = load_metadata(data_dir)
    return iter(train_dataset(data_dir, meta, DataConfig(shuffle_buffer=1000), 50, steps, 1, 0, 0, where=where))


def test_a_share_over_the_memory_limit_and_the_disk_is_read_from_the_files_every_epoch(sample_data, tmp_path, caplog):
    from trainer.core.memory import MemoryLimit, Room

    data = str(tmp_path / "data")
    shutil.copytree(sample_data, data)
    caplog.set_level("INFO", logger="trainer.data.inputs")
    steps = 80  # one epoch is the whole share: 4,000 examples
    iterator = _epochs(data, steps, Room(MemoryLimit(10_000_000, "test"), str(tmp_path), 5_000_000))
    assert caplog.messages == [
        "data cache: worker 0's share of the train split: 3.0 MiB; memory limit 9.5 MiB (test); stream: more than "
        f"0.25 of the limit (2.4 MiB left of it) and of 0.5 of the 4.8 MiB free in {tmp_path}: read from the dataset "
        "every epoch"
    ]
    first = [next(iterator) for _ in range(steps)]
    reference = _epochs(sample_data, steps)
    for got in first:
        np.testing.assert_array_equal(got[1].numpy(), next(reference)[1].numpy())
    for path in shard_paths(data, load_metadata(data), "train"):
        tf.io.gfile.remove(path)
    with pytest.raises(tf.errors.NotFoundError):  # by the next epoch at the latest (files open stay readable)
        for _ in range(2 * steps):
            next(iterator)
    assert not (tmp_path / "trainer-data-cache").exists()


def test_a_share_over_the_memory_limit_is_cached_on_local_disk(sample_data, tmp_path, monkeypatch, caplog):
    import os
    import tempfile

    from trainer.core.memory import room

    data = str(tmp_path / "data")
    shutil.copytree(sample_data, data)
    monkeypatch.setenv("TRAINER_MEMORY_LIMIT", "1Mi")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    os.makedirs(tmp_path / "scratch")
    stale = tmp_path / "scratch" / "trainer-data-cache" / "999999999"
    stale.mkdir(parents=True)
    caplog.set_level("INFO", logger="trainer.data.inputs")
    steps, epochs = 10, 3
    iterator = _epochs(data, steps, room())
    assert caplog.messages[0].startswith(
        "data cache: worker 0's share of the train split: 3.0 MiB; memory limit 1.0 MiB (TRAINER_MEMORY_LIMIT); disk: "
        "more than 0.25 of the limit (256.0 KiB left of it); it fits 0.5 of the "
    )
    first = [next(iterator) for _ in range(steps)]
    for path in shard_paths(data, load_metadata(data), "train"):
        tf.io.gfile.remove(path)
    later = [next(iterator) for _ in range((epochs - 1) * steps)]
    reference = _epochs(sample_data, steps)
    for got in first + later:
        np.testing.assert_array_equal(got[0].numpy(), next(reference)[0].numpy())
    own = tmp_path / "scratch" / "trainer-data-cache" / str(os.getpid())
    assert [p.name for p in own.iterdir()] and not stale.exists(), "its cache files, and none of a process gone"


@pytest.mark.parametrize("index", [0, 1])
def test_a_parameter_server_worker_opens_only_its_own_shard_files(sample_data, tmp_path, index, caplog):
    """ParameterServerStrategy's input pipelines take whole files when they divide evenly, as mirrored workers do:
    with 4 shards and 2 pipelines, pipeline 0 reads shards 0 and 2 and never opens 1 and 3 (they are removed)."""
    from trainer.data.inputs import ps_dataset_creator
    from trainer.data.tfrecords import decode_fn

    data = str(tmp_path / "data")
    shutil.copytree(sample_data, data)
    meta = load_metadata(data)
    files = shard_paths(data, meta, "train")
    own = files[index::2]
    reference = tf.data.TFRecordDataset(own).map(decode_fn(meta.image_shape))
    want = sorted((int(y), x.tobytes()) for x, y in reference.as_numpy_iterator())
    for path in set(files) - set(own):
        tf.io.gfile.remove(path)
    creator = ps_dataset_creator(data, meta, DataConfig(shuffle_buffer=100, seed=3), batch_size=100)
    with caplog.at_level("INFO", logger="trainer.data.inputs"):
        dataset = creator(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index))
    batches = list(dataset.take(len(want) // 100).as_numpy_iterator())
    got = sorted(
        (int(y), x.astype(np.uint8).tobytes())
        for images, labels in batches
        for x, y in zip(images, labels, strict=True)
    )
    assert len(files) == 4 and len(want) == 2000
    assert got == want, "one pass over the share is exactly the examples of this pipeline's own files"
    assert batches[0][0].dtype == np.float32 and batches[0][0].shape == (100, 28, 28, 1)
    assert f"input pipeline {index}'s share of the train split: 1.5 MiB" in caplog.text


def _prepared(path, shape, classes, count, shards):
    """A prepared dataset of random images: every label of `classes` appears (labels past 127: records of several
    lengths, which are parsed), `shards` training shards."""
    from trainer.data.tfrecords import write_split
    from trainer.records.dataset import DatasetMetadata

    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
    labels = rng.integers(0, classes, count)
    labels[:classes] = np.arange(classes)
    split = write_split(str(path), "train", zip(images, labels, strict=True), shards, shape)
    test = write_split(str(path), "test", zip(images[:100], labels[:100], strict=True), 1, shape)
    names = [f"class {n}" for n in range(classes)]
    DatasetMetadata.of_images("test", shape, names, {"train": split, "test": test}).write(str(path))
    return str(path)


@pytest.mark.parametrize(
    ("shape", "classes", "shards"),
    [((28, 28, 1), 10, 4), ((32, 32, 3), 100, 6), ((16, 16, 3), 1000, 4)],
    ids=["grey-10", "cifar-100", "labels-past-127"],
)
@pytest.mark.parametrize(("workers", "rank", "steps"), [(1, 0, 24), (2, 1, 5), (3, 2, 3)])
def test_a_streamed_share_is_batched_as_read_and_gives_the_batches_a_cached_one_gives(
    tmp_path, shape, classes, shards, workers, rank, steps
):
    """A streamed share is shuffled and batched as its records are read, each batch decoded; a cached one is decoded
    first. The same examples in the same order either way, every epoch (whole files per worker with 4 or 6 shards
    among 2 workers, every 3rd record among 3)."""
    from trainer.core.memory import MemoryLimit, Room

    data = _prepared(tmp_path / "data", shape, classes, 1210, shards)
    meta = load_metadata(data)
    config = DataConfig(shuffle_buffer=300, seed=5)
    epochs = 3

    def batches(where):
        dataset = train_dataset(data, meta, config, 16, steps, workers, rank, 1, threads=1, where=where)
        return dataset.element_spec, list(dataset.take(epochs * steps).as_numpy_iterator())

    spec, streamed = batches(Room(MemoryLimit(1000, "test"), str(tmp_path), 1000))
    cached_spec, cached = batches(None)
    # What a model's step is traced for: a batch of unknown length would trace another, slower step.
    assert spec == cached_spec and spec[0].shape == (16 * workers, *shape)
    assert len(streamed) == len(cached) == epochs * steps
    for (x, y), (want_x, want_y) in zip(streamed, cached, strict=True):
        assert x.dtype == np.float32 and x.shape == (16 * workers, *shape)
        np.testing.assert_array_equal(x, want_x)
        np.testing.assert_array_equal(y, want_y)
    stream = [image.tobytes() for x, _ in streamed for image in x]
    assert len(set(stream[: steps * 16])) == steps * 16, "an epoch's examples are distinct, not one repeated"
