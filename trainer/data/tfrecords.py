"""The prepared-dataset format: TFRecord shards per split plus `metadata.json`.

Each record holds `image` (raw uint8 bytes, row-major `height x width x channels`) and `label` (int64).
The metadata (`trainer.records.dataset`) lists example counts per split, the image shape, the classes and every shard
with its SHA-256, so training and evaluation can refuse a corrupted or incomplete dataset before they start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import exists
from trainer.records.dataset import DatasetMetadata, Shard, Split


def shard_name(split: str, index: int, count: int) -> str:
    """The file name of one shard: `train-00001-of-00004.tfrecord`."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def _sha256(path: str) -> str:
    import tensorflow as tf

    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_split(
    directory: str,
    split: str,
    examples: Iterable[tuple[np.ndarray, int]],
    num_shards: int,
    image_shape: tuple[int, int, int],
) -> Split:
    """Writes `(image, label)` pairs round-robin into `num_shards` TFRecord files; returns the split's metadata."""
    import tensorflow as tf

    names = [shard_name(split, i, num_shards) for i in range(num_shards)]
    counts = [0] * num_shards
    writers = [tf.io.TFRecordWriter(f"{directory}/{name}") for name in names]
    try:
        for n, (image, label) in enumerate(examples):
            image = _of_shape(np.asarray(image, dtype=np.uint8), image_shape, split, n)
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }
                )
            )
            writers[n % num_shards].write(example.SerializeToString())
            counts[n % num_shards] += 1
    finally:
        for writer in writers:
            writer.close()
    total = sum(counts)
    if total == 0:
        raise UsageError(f"split {split!r} has no examples")
    shards = [Shard(name, count, _sha256(f"{directory}/{name}")) for name, count in zip(names, counts, strict=True)]
    return Split(total, tuple(shards))


def _of_shape(image: np.ndarray, image_shape: tuple[int, int, int], split: str, index: int) -> np.ndarray:
    """`image` as `image_shape` (a grey image may come without its channel axis).

    Raises:
        UsageError: it has another shape, naming the split, the example and both shapes.
    """
    if image.shape == image_shape or (image.shape == image_shape[:2] and image_shape[2] == 1):
        return image.reshape(image_shape)
    raise UsageError(
        f"split {split!r} has an image of shape {list(image.shape)} (example {index}) but the dataset's images are "
        f"{list(image_shape)}; allowed: images of one shape (resize them to one size when you prepare them)"
    )


def load_metadata(directory: str) -> DatasetMetadata:
    """Reads and checks `metadata.json` of a prepared dataset (`DatasetMetadata.read`).

    Raises:
        UsageError: naming the directory when the metadata is missing or malformed.
    """
    return DatasetMetadata.read(directory)


def shard_paths(directory: str, meta: DatasetMetadata, split: str) -> list[str]:
    """The paths of a split's shards."""
    return [f"{directory.rstrip('/')}/{s.file}" for s in meta.split(split, directory).shards]


def verify_split(directory: str, meta: DatasetMetadata, split: str) -> None:
    """Checks every shard of a split exists and matches its recorded SHA-256.

    Raises:
        UsageError: naming the first shard that is missing or whose checksum differs.
    """
    for shard, path in zip(meta.split(split, directory).shards, shard_paths(directory, meta, split), strict=True):
        if not exists(path):
            raise UsageError(f"dataset shard {path!r} is missing")
        actual = _sha256(path)
        if actual != shard.sha256:
            raise UsageError(
                f"dataset shard {path!r} is corrupted: sha256 {actual[:12]}... differs from "
                f"{shard.sha256[:12]}... in the metadata"
            )


def decode_fn(image_shape: tuple[int, int, int]):
    """A tf.data map function from a serialized Example to `(uint8 image, int64 label)`."""
    import tensorflow as tf

    features = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(serialized):
        parsed = tf.io.parse_single_example(serialized, features)
        image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), image_shape)
        return image, parsed["label"]

    return decode


def read_arrays(directory: str, split: str) -> tuple[np.ndarray, np.ndarray, DatasetMetadata]:
    """Loads a whole split into memory (for evaluation and tests): images `[n, h, w, c]`, labels `[n]`, metadata."""
    import tensorflow as tf

    meta = load_metadata(directory)
    verify_split(directory, meta, split)
    ds = tf.data.TFRecordDataset(shard_paths(directory, meta, split)).map(decode_fn(meta.image_shape)).batch(4096)
    images, labels = [], []
    for x, y in ds.as_numpy_iterator():
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels), meta
