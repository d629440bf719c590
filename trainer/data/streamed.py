"""TFRecord files TensorFlow cannot open (`s3://` in TF 2.21) as `tf.data` datasets: ranged reads through fsspec.

Why this reader: TensorFlow 2.21's file systems have no `s3://` (tensorflow-io, which had it, has no release past
TF 2.16), and Kubeflow's own store is S3 (SeaweedFS). Among the ways left:

- fsspec/s3fs (chosen): already how this project reads and writes S3 (`trainer.storage.locations`: the same
  credentials, endpoint and fault rules), ranged GETs of any size, maintained with the Python data stack;
- mounting the bucket (s3fs-fuse, Mountpoint for S3): a FUSE device in the pod, which needs a privileged container
  or a CSI driver the cluster may not have;
- copying a worker's files to local disk first: start-up time and a disk that grow with the share;
- boto3 alone: the same requests with retries, ranges and credentials written again here.

A file is read in order, `READ_BYTES` per request (less when many files are open at once: `read_bytes`;
`trainer.data.place.Place.chunks`), each request retried on a transient fault as every store call is; the records
of each chunk are checked (both CRC-32Cs of every record, `trainer.data.framing.records`) and handed to tf.data as
one string tensor, unbatched there, so Python runs once per chunk, not once per record. Several files are read at
once by `tf.data.Dataset.interleave` (up to `READ_THREADS` threads), in the order `tf.data.TFRecordDataset` would
give: file after file, or round-robin with `deterministic=True`.

What stays out: `tf.data` runs the reading in this process's Python (`from_generator`), so a ParameterServerStrategy
worker, which runs the coordinator's dataset function as a graph of its own, cannot use it (`check_graph_readable`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from trainer.core.errors import UsageError
from trainer.data.framing import FramingError, records
from trainer.data.place import READ_BYTES, Place

# What a worker's open files hold at once: at most this many bytes of chunks in all (each file at least
# `MIN_READ_BYTES` a request), through at most `READ_THREADS` requests at a time.
STREAM_BYTES = 64 << 20
MIN_READ_BYTES = 256 << 10
READ_THREADS = 8


def read_bytes(files: int) -> int:
    """Bytes per ranged read when `files` files are open at once: `READ_BYTES`, less as they share `STREAM_BYTES`."""
    return max(MIN_READ_BYTES, min(READ_BYTES, STREAM_BYTES // max(1, files)))


class _Chunks:
    """A file's ranged reads as a `read(n)` stream for `records` (n is always the chunk size)."""

    def __init__(self, place: Place, name: str, chunk_bytes: int) -> None:
        self._chunks = place.chunks(name, chunk_bytes)

    def read(self, n: int) -> bytes:
        return next(self._chunks, b"")


def file_records(place: Place, name: str, chunk_bytes: int = READ_BYTES) -> Iterator[np.ndarray]:
    """The records of one file, as an array of `bytes` per ranged read of `chunk_bytes`.

    Raises:
        UsageError: the file's records are damaged (a checksum differs, a record is cut off), naming the file.
    """
    try:
        for found in records(_Chunks(place, name, chunk_bytes), chunk_bytes, place.uri(name)):
            yield np.array(found, dtype=object)
    except FramingError as err:
        raise UsageError(f"dataset shard {err}; prepare the dataset again") from None


def dataset(place: Place, names: list[str], parallel: int, interleaved: bool) -> Any:
    """The records of `names` as a `tf.data` dataset of scalar strings.

    Args:
        place: where the files are.
        names: the files, in order.
        parallel: files read at once (1: one after another), at most `READ_THREADS`; the chunks of the files open
            at once share `STREAM_BYTES` (`read_bytes`).
        interleaved: round-robin over all `names` (as `interleave(cycle_length=len(names))` of `TFRecordDataset`s),
            else file after file (as one `TFRecordDataset(names)`).
    """
    import tensorflow as tf

    chunk_bytes = read_bytes(len(names) if interleaved else 1)

    def one(name: Any) -> Any:
        return tf.data.Dataset.from_generator(
            lambda n: file_records(place, n.decode(), chunk_bytes),
            args=(name,),
            output_signature=tf.TensorSpec([None], tf.string),
        ).unbatch()

    files = tf.data.Dataset.from_tensor_slices(names)
    if not interleaved:
        return files.flat_map(one)
    return files.interleave(
        one,
        cycle_length=len(names),
        block_length=1,
        num_parallel_calls=max(1, min(parallel, READ_THREADS)),
        deterministic=True,
    )


def check_graph_readable(place: Place, what: str) -> None:
    """Refuses a place that only this process's Python can read, for a dataset function run elsewhere.

    Raises:
        UsageError: `place` is on `s3://`.
    """
    if not place.native:
        raise UsageError(
            f"{what} reads the dataset at {place.base!r} on its workers through TensorFlow's own file systems, which "
            "have no s3:// in TensorFlow 2.21; allowed: a dataset at gs://, on a path every pod mounts, or inside "
            "the Dataset artifact (data_uri empty)"
        )
