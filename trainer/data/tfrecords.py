"""The prepared-dataset format: TFRecord shards per split plus `metadata.json`.

Each record holds `image` (raw uint8 bytes, row-major `height x width x channels`) and `label` (int64).
The metadata (`trainer.records.dataset`) lists example counts per split, the image shape, the classes and every shard
with its SHA-256, so training and evaluation can refuse a corrupted or incomplete dataset before they start.

Example `i` of a split goes to shard `i % num_shards`, in order. Each record is serialized deterministically (the
features' map in key order): protobuf otherwise orders a map as its hash table does, which differs from process to
process, so the same examples gave shards of other bytes (and checksums) from one run to the next. A shard's bytes
are a function of its examples alone, whichever process writes it (`trainer.data.writers`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import exists
from trainer.records.dataset import DatasetMetadata, Shard, Split

# Sources are read, and examples travel from a source to the shard writers, in chunks of about this many bytes.
CHUNK_BYTES = 1 << 17


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


def shard_slices(start: int, images: np.ndarray, labels: np.ndarray, num_shards: int) -> Iterator[tuple[int, Any, Any]]:
    """`(shard, images, labels)` of each shard with examples in a chunk whose first example is `start` of its split."""
    for shard in range(num_shards):
        offset = (shard - start) % num_shards
        if offset < len(labels):
            yield shard, images[offset::num_shards], labels[offset::num_shards]


def chunked(
    examples: Iterable[tuple[np.ndarray, int]], image_shape: tuple[int, int, int], split: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`(image, label)` pairs as `(images [k, *image_shape] uint8, labels [k] int64)` chunks of ~CHUNK_BYTES, in order.

    Raises:
        UsageError: an image has another shape (`_of_shape`).
    """
    size = max(1, CHUNK_BYTES // max(1, int(np.prod(image_shape))))
    images: list[np.ndarray] = []
    labels: list[int] = []
    for n, (image, label) in enumerate(examples):
        images.append(_of_shape(np.asarray(image, dtype=np.uint8), image_shape, split, n))
        labels.append(int(label))
        if len(labels) == size:
            yield np.stack(images), np.asarray(labels, np.int64)
            images, labels = [], []
    if labels:
        yield np.stack(images), np.asarray(labels, np.int64)


class ShardWriter:
    """Writes some shards of one split, each from the examples given to it in order; `finish` checksums them.

    Used as a context manager: leaving it without `finish` closes the files as they are.
    """

    def __init__(self, directory: str, split: str, shards: Iterable[int], num_shards: int) -> None:
        import tensorflow as tf

        self._tf = tf
        self.directory, self.split, self.num_shards = directory, split, num_shards
        self._names = {shard: shard_name(split, shard, num_shards) for shard in shards}
        self._counts = dict.fromkeys(self._names, 0)
        self._writers = {shard: tf.io.TFRecordWriter(f"{directory}/{name}") for shard, name in self._names.items()}

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self._close()

    def add(self, start: int, images: np.ndarray, labels: np.ndarray) -> None:
        """Writes this writer's examples of a chunk of the split whose first example has index `start`."""
        for shard, shard_images, shard_labels in shard_slices(start, images, labels, self.num_shards):
            if shard in self._names:
                self.write(shard, shard_images, shard_labels)

    def write(self, shard: int, images: np.ndarray, labels: np.ndarray) -> None:
        """Appends examples to one shard."""
        tf, writer = self._tf, self._writers[shard]
        for image, label in zip(images, labels, strict=True):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                    }
                )
            )
            writer.write(example.SerializeToString(deterministic=True))
        self._counts[shard] += len(labels)

    def finish(self) -> dict[int, Shard]:
        """Closes the shards and returns each one's metadata by shard index."""
        self._close()
        return {
            shard: Shard(name, self._counts[shard], _sha256(f"{self.directory}/{name}"))
            for shard, name in self._names.items()
        }

    def _close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def split_of(split: str, shards: dict[int, Shard]) -> Split:
    """A split's metadata from all its shards.

    Raises:
        UsageError: the split has no examples.
    """
    total = sum(s.num_examples for s in shards.values())
    if total == 0:
        raise UsageError(f"split {split!r} has no examples")
    return Split(total, tuple(shards[i] for i in sorted(shards)))


def write_split(
    directory: str,
    split: str,
    examples: Iterable[tuple[np.ndarray, int]],
    num_shards: int,
    image_shape: tuple[int, int, int],
) -> Split:
    """Writes `(image, label)` pairs round-robin into `num_shards` TFRecord files; returns the split's metadata."""
    return split_of(split, write_chunks(directory, split, chunked(examples, image_shape, split), num_shards))


def numbered(
    chunks: Iterable[tuple[np.ndarray, np.ndarray]],
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Each `(images, labels)` chunk of a split with the index in the split of its first example."""
    start = 0
    for images, labels in chunks:
        yield start, images, labels
        start += len(labels)


def write_chunks(
    directory: str, split: str, chunks: Iterable[tuple[np.ndarray, np.ndarray]], num_shards: int
) -> dict[int, Shard]:
    """Writes a split's chunks, in order, into all its `num_shards` shards in this process; returns their metadata."""
    with ShardWriter(directory, split, range(num_shards), num_shards) as writer:
        for start, images, labels in numbered(chunks):
            writer.add(start, images, labels)
        return writer.finish()


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
