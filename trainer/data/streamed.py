"""TFRecord files TensorFlow cannot open (`s3://` in TF 2.21) as `tf.data` datasets: ranged reads through fsspec.

Why this reader: TensorFlow 2.21's file systems have no `s3://` (tensorflow-io, which had it, has no release past
TF 2.16), and Kubeflow's own store is S3 (SeaweedFS). Among the ways left:

- fsspec/s3fs (chosen): already how this project reads and writes S3 (`trainer.storage.locations`: the same
  credentials, endpoint and fault rules), ranged GETs of any size, maintained with the Python data stack;
- mounting the bucket (s3fs-fuse, Mountpoint for S3): a FUSE device in the pod, which needs a privileged container
  or a CSI driver the cluster may not have;
- copying a worker's files to local disk first: start-up time and a disk that grow with the share;
- boto3 alone: the same requests with retries, ranges and credentials written again here.

A file is read in order, `READ_BYTES` per request (`trainer.data.place.Place.chunks`), each request retried on a
transient fault as every store call is; the records of each chunk are checked (both CRC-32Cs of every record,
`trainer.data.framing.records`) and handed to tf.data as one string tensor, unbatched there, so Python runs once per
chunk, not once per record. Several files are read at once by `tf.data.Dataset.interleave` (one thread each), in the
order `tf.data.TFRecordDataset` would give: file after file, or round-robin with `deterministic=True`.

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


class _Chunks:
    """A file's ranged reads as a `read(n)` stream for `records` (n is always `READ_BYTES`)."""

    def __init__(self, place: Place, name: str) -> None:
        self._chunks = place.chunks(name, READ_BYTES)

    def read(self, n: int) -> bytes:
        return next(self._chunks, b"")


def file_records(place: Place, name: str) -> Iterator[np.ndarray]:
    """The records of one file, as an array of `bytes` per ranged read.

    Raises:
        UsageError: the file's records are damaged (a checksum differs, a record is cut off), naming the file.
    """
    try:
        for found in records(_Chunks(place, name), READ_BYTES, place.uri(name)):
            yield np.array(found, dtype=object)
    except FramingError as err:
        raise UsageError(f"dataset shard {err}; prepare the dataset again") from None


def dataset(place: Place, names: list[str], parallel: int, interleaved: bool) -> Any:
    """The records of `names` as a `tf.data` dataset of scalar strings.

    Args:
        place: where the files are.
        names: the files, in order.
        parallel: files read at once (1: one after another).
        interleaved: round-robin over all `names` (as `interleave(cycle_length=len(names))` of `TFRecordDataset`s),
            else file after file (as one `TFRecordDataset(names)`).
    """
    import tensorflow as tf

    def one(name: Any) -> Any:
        return tf.data.Dataset.from_generator(
            lambda n: file_records(place, n.decode()),
            args=(name,),
            output_signature=tf.TensorSpec([None], tf.string),
        ).unbatch()

    files = tf.data.Dataset.from_tensor_slices(names)
    if not interleaved:
        return files.flat_map(one)
    return files.interleave(
        one, cycle_length=len(names), block_length=1, num_parallel_calls=max(1, parallel), deterministic=True
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
