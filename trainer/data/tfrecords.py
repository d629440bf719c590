"""The prepared-dataset format: TFRecord shards per split plus `metadata.json`.

Each record holds `image` (raw uint8 bytes, row-major `height x width x channels`) and `label` (int64).
The metadata (`trainer.records.dataset`) lists example counts per split, the image shape, the classes and every shard
with its SHA-256, so training and evaluation can refuse a corrupted or incomplete dataset before they start. The
shards are beside metadata.json, or where its `location` says (`data_uri`: a bucket or a claim; `shard_place`).

Example `i` of a split goes to shard `i % num_shards`, in order. Each record is the Example TensorFlow would
serialize deterministically (the features' map in key order), framed as `tf.io.TFRecordWriter` frames it
(`trainer.data.framing`, which needs no TensorFlow), so the same examples give the same bytes, whichever process
writes a shard and wherever it goes (`trainer.data.writers`). A shard's SHA-256 is taken as it is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.data.framing import FixedLayout, fixed_layout, frame, image_example
from trainer.data.place import Place
from trainer.records.dataset import DatasetMetadata, Shard, Split

# Sources are read, and examples travel from a source to the shard writers, in chunks of about this many bytes.
CHUNK_BYTES = 1 << 17
# A shard's records are joined and written this many bytes at a time: a larger buffer, allocated and freed for every
# write, is mapped and unmapped by malloc each time (page faults: a fifth of a writing process's CPU with 1 MiB).
WRITE_BYTES = 1 << 16
# Records decoded at once by `batched_map` (a vectorized parse or cut; the order is kept).
DECODE_BATCH = 128


def shard_name(split: str, index: int, count: int) -> str:
    """The file name of one shard: `train-00001-of-00004.tfrecord`."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


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
    """Writes some shards of one split at `place`, each from the examples given to it in order; `finish` ends them.

    Used as a context manager: leaving it without `finish` leaves the shards unfinished (a store keeps no part of
    an upload that was not completed).
    """

    def __init__(self, place: Place | str, split: str, shards: Iterable[int], num_shards: int) -> None:
        self.place = place if isinstance(place, Place) else Place.of(place)
        self.split, self.num_shards = split, num_shards
        self._names = {shard: shard_name(split, shard, num_shards) for shard in shards}
        self._counts = dict.fromkeys(self._names, 0)
        self._digests = {shard: hashlib.sha256() for shard in self._names}
        self._stack = contextlib.ExitStack()
        self._files = {shard: self._stack.enter_context(self.place.writer(name)) for shard, name in self._names.items()}

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    def add(self, start: int, images: np.ndarray, labels: np.ndarray) -> None:
        """Writes this writer's examples of a chunk of the split whose first example has index `start`."""
        for shard, shard_images, shard_labels in shard_slices(start, images, labels, self.num_shards):
            if shard in self._names:
                self.write(shard, shard_images, shard_labels)

    def write(self, shard: int, images: np.ndarray, labels: np.ndarray) -> None:
        """Appends examples to one shard, in writes of about `WRITE_BYTES` (at least one record)."""
        file, digest = self._files[shard], self._digests[shard]
        records, size = [], 0
        for image, label in zip(images, labels, strict=True):
            records.append(frame(image_example(image.tobytes(), int(label))))
            size += len(records[-1])
            if size >= WRITE_BYTES:
                data = b"".join(records)
                file.write(data)
                digest.update(data)
                records, size = [], 0
        if records:
            data = b"".join(records)
            file.write(data)
            digest.update(data)
        self._counts[shard] += len(labels)

    def finish(self) -> dict[int, Shard]:
        """Completes the shards and returns each one's metadata by shard index."""
        self._stack.close()
        return {
            shard: Shard(name, self._counts[shard], self._digests[shard].hexdigest())
            for shard, name in self._names.items()
        }


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
    directory: Place | str,
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
    directory: Place | str, split: str, chunks: Iterable[tuple[np.ndarray, np.ndarray]], num_shards: int
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


def shard_place(directory: str, meta: DatasetMetadata) -> Place:
    """Where the shards of the dataset whose metadata.json is in `directory` are: its `location`, else beside it."""
    return Place.of(meta.location, meta.endpoint) if meta.location else Place.of(directory)


def shard_paths(directory: str, meta: DatasetMetadata, split: str) -> list[str]:
    """The paths (or URIs) of a split's shards."""
    place = shard_place(directory, meta)
    return [place.uri(s.file) for s in meta.split(split, directory).shards]


def verify_split(directory: str, meta: DatasetMetadata, split: str, only: Iterable[int] | None = None) -> None:
    """Checks that the shards of a split (those numbered `only`, default all) exist and match their SHA-256.

    Raises:
        UsageError: naming the first shard that is missing or whose checksum differs.
    """
    place = shard_place(directory, meta)
    shards = meta.split(split, directory).shards
    for index in sorted(set(range(len(shards)) if only is None else only)):
        shard = shards[index]
        path = place.uri(shard.file)
        if not place.exists(shard.file):
            raise UsageError(f"dataset shard {path!r} is missing")
        actual = place.sha256(shard.file)
        if actual != shard.sha256:
            raise UsageError(
                f"dataset shard {path!r} is corrupted: sha256 {actual[:12]}... differs from "
                f"{shard.sha256[:12]}... in the metadata"
            )


def _image_features() -> dict[str, Any]:
    """The features of an image Example (`trainer.data.framing.image_example`) as TensorFlow parses them."""
    import tensorflow as tf

    return {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def decode_fn(image_shape: tuple[int, int, int]):
    """A tf.data map function from a serialized Example to `(uint8 image, int64 label)`."""
    import tensorflow as tf

    features = _image_features()

    def decode(serialized):
        parsed = tf.io.parse_single_example(serialized, features)
        image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), image_shape)
        return image, parsed["label"]

    return decode


def parser(image_shape: tuple[int, int, int]) -> Callable[[Any], tuple[Any, Any]]:
    """A map function from a batch of serialized Examples to `(uint8 images, int64 labels)`: one vectorized parse.

    A parse per batch costs about two thirds of a parse per record (96x96x3 images: 40 against 61 µs a record on
    one core, read, shuffled and batched).
    """
    import tensorflow as tf

    features = _image_features()

    def decode(serialized):
        parsed = tf.io.parse_example(serialized, features)
        images = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (-1, *image_shape))
        return _as_many(images, serialized), parsed["label"]

    return decode


def _as_many(images: Any, batch: Any) -> Any:
    """`images` with the static length of `batch`.

    A training batch's length is fixed (`drop_remainder`), and a model's distributed step is traced for it: one of
    unknown length traces another step (slower here, with other float results).
    """
    images.set_shape(batch.shape[:1].concatenate(images.shape[1:]))
    return images


def cutter(layout: FixedLayout, image_shape: tuple[int, int, int], what: str) -> Callable[[Any], tuple[Any, Any]]:
    """A map function from a batch of records of one length (`layout`) to `(uint8 images, int64 labels)`, cut out.

    What `parser` gives for such records, without parsing them: each record's bytes around the image and the label
    are compared with the layout's (InvalidArgumentError naming `what` when one differs).
    """
    import tensorflow as tf

    head = tf.constant(np.frombuffer(layout.head, np.uint8))
    tail = tf.constant(np.frombuffer(layout.tail, np.uint8))
    start, end, label = len(layout.head), len(layout.head) + layout.image_bytes, layout.label_offset
    message = f"a record of {what} is not an image Example of shape {list(image_shape)}; prepare the dataset again"

    def decode(batch):
        raw = tf.io.decode_raw(batch, tf.uint8)
        checks = [
            tf.debugging.assert_equal(raw[:, :start], head[None], message=message),
            tf.debugging.assert_equal(raw[:, end:label], tail[None], message=message),
            tf.debugging.assert_less(raw[:, label], tf.constant(128, tf.uint8), message=message),
        ]
        with tf.control_dependencies(checks):
            images = tf.reshape(raw[:, start:end], (-1, *image_shape))
            labels = tf.cast(raw[:, label], tf.int64)
        return _as_many(images, batch), labels

    return decode


def map_batches(batches: Any, decode: Callable[[Any], Any], parallel: Any = None) -> Any:
    """`decode` of each of `batches`, in order; `parallel`: `num_parallel_calls` (None: in the pipeline's thread)."""
    if parallel:
        return batches.map(decode, num_parallel_calls=parallel, deterministic=True)
    return batches.map(decode)


def batched_map(records: Any, decode: Callable[[Any], Any], parallel: Any = None) -> Any:
    """`decode` (a map function on batches) of `records` `DECODE_BATCH` at a time, in order, unbatched."""
    return map_batches(records.batch(DECODE_BATCH), decode, parallel).unbatch()


def fixed_length(place: Place, shards: Iterable[Shard], layout: FixedLayout) -> bool:
    """Whether every file of `shards` at `place` is its examples' framed records of `layout`'s length (by its size)."""
    return all(place.size(s.file) == s.num_examples * layout.record_bytes for s in shards)


def read_as(
    place: Place,
    shards: list[Shard],
    image_shape: tuple[int, int, int],
    interleaved: bool,
    reads_aside: bool = True,
) -> tuple[Any, Callable[[Any], tuple[Any, Any]]]:
    """The records of `shards` at `place` as they are read, and the map function that decodes a batch of them.

    Files of records of one length (`trainer.data.framing.fixed_layout`: every image Example of one size whose label
    is 0 to 127, as this project prepares them; checked by each file's size) are read as fixed-length records and cut
    (`cutter`), for less CPU per example than parsing them as Examples (`parser`, which reads any other; the figures:
    docs/data.md). On a path or `gs://` TensorFlow then reads the records without checking each one's CRC-32C: the
    shards' SHA-256 is checked before training and evaluation (`verify_split`), not again as later epochs read them.
    From `s3://` every record's CRC-32C is checked as it is read (`trainer.data.streamed`).

    Args:
        place: where the shards are.
        shards: the files, in order.
        image_shape: the images' shape.
        interleaved: round-robin over the files (one record of each in turn), else file after file.
        reads_aside: read the files open at once in threads of their own (tf.data's parallel interleave), else in
            the pipeline's thread, one record of each in turn.

    Returns:
        `(records, decode)`: a dataset of records (strings), and a map function from a batch of them (any number) to
        `(uint8 images, int64 labels)`.
    """
    names = [s.file for s in shards]
    framed = fixed_layout(math.prod(image_shape), framed=True)
    if not fixed_length(place, shards, framed):
        return records_of(place, names, interleaved, reads_aside), parser(image_shape)
    # What reaches tf.data: the framed records from TensorFlow's own reader, their data alone from fsspec's.
    layout = framed if place.native else fixed_layout(framed.image_bytes, framed=False)
    what = place.uri(names[0]) if len(names) == 1 else f"the {len(names)} shards at {place.base}"
    return records_of(place, names, interleaved, reads_aside, layout), cutter(layout, image_shape, what)


def pairs_of(
    place: Place,
    shards: list[Shard],
    image_shape: tuple[int, int, int],
    interleaved: bool,
    parallel: Any = None,
    reads_aside: bool = True,
) -> Any:
    """The `(uint8 image, int64 label)` pairs of `shards` at `place` in order (`read_as`), decoded a batch at a time.

    `parallel`: `num_parallel_calls` of the decoding map (None: in the pipeline's thread).
    """
    records, decode = read_as(place, shards, image_shape, interleaved, reads_aside)
    return batched_map(records, decode, parallel)


def records_of(
    place: Place, names: list[str], interleaved: bool, reads_aside: bool = True, layout: FixedLayout | None = None
) -> Any:
    """The records of files `names` at `place`: file after file, or round-robin over them (in order).

    TensorFlow reads a path or `gs://` itself: TFRecords, or with `layout` fixed-length records framed as they are
    (`tf.data.FixedLengthRecordDataset`). `s3://` is read through fsspec (`trainer.data.streamed`): each record's
    data, its checksums checked. `reads_aside`: the files open at once are read in threads of their own.
    """
    import tensorflow as tf

    if not place.native:
        from trainer.data.streamed import dataset

        return dataset(place, names, len(names) if interleaved else 1, interleaved)
    paths = [place.uri(n) for n in names]

    def one(path):
        if layout is None:
            return tf.data.TFRecordDataset(path)
        return tf.data.FixedLengthRecordDataset(path, layout.record_bytes)

    files = tf.data.Dataset.from_tensor_slices(paths)
    if not interleaved:
        return files.flat_map(one)
    if not reads_aside:
        return files.interleave(one, cycle_length=len(paths), block_length=1)
    return files.interleave(
        one, cycle_length=len(paths), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True, block_length=1
    )


def read_arrays(directory: str, split: str) -> tuple[np.ndarray, np.ndarray, DatasetMetadata]:
    """Loads a whole split into memory (for evaluation and tests): images `[n, h, w, c]`, labels `[n]`, metadata."""
    meta = load_metadata(directory)
    verify_split(directory, meta, split)
    place = shard_place(directory, meta)
    shards = list(meta.split(split, directory).shards)
    images, labels = [], []
    for x, y in pairs_of(place, shards, meta.image_shape, interleaved=False).batch(4096):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels), meta
