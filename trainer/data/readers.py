"""How a prepared dataset is read into `(features, label)` pairs: one reader per format, picked by its metadata.

    reader = readers.of(data_dir, meta)   # ImageShards or SavedSplits
    reader.verify("train")                # refuses a missing or corrupted split before training starts
    pairs = reader.fed(reader.stored("test"))
    share = reader.share("train", workers, rank)
    cached = share.stored().cache()       # decoded once, kept as stored pairs
    streamed = share.decoded(share.read.shuffle(4096).batch(256))  # decoded a batch at a time, after shuffling

`trainer.data.inputs` builds every worker's input pipeline on a reader and never asks which format it reads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

from trainer.records.dataset import IMAGES, SAVED, DatasetMetadata, Shard


class Reader(Protocol):
    """What the input pipelines need of a prepared dataset's format."""

    data_dir: str
    meta: DatasetMetadata

    def verify(self, split: str, workers: int = 1, rank: int = 0) -> None:
        """Refuses this worker's share of a split whose files are missing or differ from the metadata (UsageError)."""

    def stored(self, split: str) -> Any:
        """A whole split as stored, unbatched, in order."""

    def share(self, split: str, workers: int, rank: int, threads: int = 0) -> Share:
        """This worker's share of `split` (every worker's shares together are the split, once).

        `threads`: the size of the input pipeline's thread pool (0: tf.data's default, every core).
        """

    def fed(self, ds: Any, parallel: Any = None) -> Any:
        """`ds` (stored pairs, batched or not) as training feeds it; `parallel`: `num_parallel_calls` of the map."""

    def cache_bytes(self, split: str, count: int) -> int:
        """The bytes `count` examples of `split` take in a tf.data cache."""


@dataclasses.dataclass(frozen=True)
class Share:
    """A worker's share of a split as its files are read, and how a batch of what is read becomes stored pairs.

    A share kept in a cache is decoded once (`stored`); a share read again every epoch is shuffled and batched as
    read, and each batch decoded (`decoded`): the same pairs in the same order (a shuffle's order depends only on
    its seed and buffer size), without cutting the records into pairs and batching them again.
    """

    read: Any
    decode: Callable[[Any], Any] | None = None  # None: `read` is stored pairs already

    def stored(self, parallel: Any = None) -> Any:
        """The share as stored pairs, unbatched, in order; `parallel`: `num_parallel_calls` of the decoding."""
        from trainer.data.tfrecords import batched_map

        return self.read if self.decode is None else batched_map(self.read, self.decode, parallel)

    def decoded(self, batches: Any, parallel: Any = None) -> Any:
        """Batches of `read`'s elements as batches of stored pairs."""
        from trainer.data.tfrecords import map_batches

        return batches if self.decode is None else map_batches(batches, self.decode, parallel)


def _as_float(images: Any, labels: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    return tf.cast(images, tf.float32), labels


def by_file(files: list[Any], workers: int) -> bool:
    """Whether workers take whole files (they divide evenly among them), else every N-th record."""
    return workers > 1 and len(files) % workers == 0


class ImageShards:
    """TFRecord shards of uint8 images (`trainer.data.tfrecords`), checked by SHA-256 and fed as float32.

    The shards are read where they are (`tfrecords.shard_place`): by TensorFlow itself on a path or `gs://`, through
    fsspec on `s3://` (`trainer.data.streamed`). A worker opens only the files of its share when they divide evenly.
    """

    def __init__(self, data_dir: str, meta: DatasetMetadata) -> None:
        from trainer.data.tfrecords import shard_place

        self.data_dir, self.meta = data_dir, meta
        self.place = shard_place(data_dir, meta)

    def verify(self, split: str, workers: int = 1, rank: int = 0) -> None:
        """The shards of this worker's share of `split` exist and match their SHA-256.

        All of them when the share is every N-th record (which reads every file).
        """
        from trainer.data.tfrecords import verify_split

        count = len(self.meta.split(split, self.data_dir).shards)
        only = range(rank, count, workers) if by_file(list(range(count)), workers) else None
        verify_split(self.data_dir, self.meta, split, only)

    def _shards(self, split: str) -> list[Shard]:
        return list(self.meta.split(split, self.data_dir).shards)

    def stored(self, split: str) -> Any:
        """`(uint8 image, int64 label)` pairs, shard after shard."""
        from trainer.data.tfrecords import pairs_of

        return pairs_of(self.place, self._shards(split), self.meta.image_shape, interleaved=False)

    def share(self, split: str, workers: int, rank: int, threads: int = 0) -> Share:
        """Whole files when they divide evenly among the workers, else every N-th record, in order.

        With one thread for the input pipeline, files on a path are read in it (one record of each in turn): threads
        reading beside it would only take turns with it on that one CPU. Elsewhere, or with more threads, the files
        open at once are read in threads of their own.
        """
        from trainer.data.tfrecords import read_as

        shards = self._shards(split)
        whole = by_file(shards, workers)
        aside = threads != 1 or bool(self.place.scheme)
        mine = shards[rank::workers] if whole else shards
        records, decode = read_as(self.place, mine, self.meta.image_shape, interleaved=True, reads_aside=aside)
        if workers > 1 and not whole:
            records = records.shard(workers, rank)
        return Share(records, decode)

    def fed(self, ds: Any, parallel: Any = None) -> Any:
        """Images as float32 pixels 0-255."""
        return ds.map(_as_float, num_parallel_calls=parallel)

    def cache_bytes(self, split: str, count: int) -> int:
        """Decoded images and their labels."""
        return count * (math.prod(self.meta.image_shape or ()) + 8)


class SavedSplits:
    """Your function's splits saved by tf.data (`trainer.data.user_source`), fed as the function returned them."""

    def __init__(self, data_dir: str, meta: DatasetMetadata) -> None:
        self.data_dir, self.meta = data_dir, meta

    def verify(self, split: str, workers: int = 1, rank: int = 0) -> None:
        """Nothing before training: `load_split` refuses a missing split, and tf.data checks what it reads."""

    def stored(self, split: str) -> Any:
        """The function's `(features, label)` pairs in the order they were saved (`load_split`)."""
        from trainer.data.user_source import load_split

        return load_split(self.data_dir, self.meta, split)

    def share(self, split: str, workers: int, rank: int, threads: int = 0) -> Share:
        """Every N-th pair."""
        records = self.stored(split)
        return Share(records.shard(workers, rank) if workers > 1 else records)

    def fed(self, ds: Any, parallel: Any = None) -> Any:
        """`ds` as it is."""
        return ds

    def cache_bytes(self, split: str, count: int) -> int:
        """The split's files' bytes in proportion to `count` (its tensors as written: uncompressed)."""
        from trainer.data.user_source import split_bytes

        total = self.meta.num_examples(split)
        return math.ceil(split_bytes(self.data_dir, self.meta, split) * count / total)


READERS: dict[str, type[ImageShards] | type[SavedSplits]] = {IMAGES: ImageShards, SAVED: SavedSplits}


def of(data_dir: str, meta: DatasetMetadata) -> Reader:
    """The reader of the dataset in `data_dir`, by its metadata's format."""
    return READERS[meta.format](data_dir, meta)
