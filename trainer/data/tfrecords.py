"""The prepared-dataset format: TFRecord shards per split plus `metadata.json`.

Each record holds `image` (raw uint8 bytes, row-major `height x width x channels`) and `label` (int64).
The metadata lists example counts per split, the image shape, the classes and every shard with its SHA-256,
so training and evaluation can refuse a corrupted or incomplete dataset before they start.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from trainer import __version__
from trainer.core.errors import UsageError
from trainer.core.files import exists, read_json

METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1
SPLITS = ("train", "test")


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
) -> dict[str, Any]:
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
    shards = [
        {"file": name, "num_examples": count, "sha256": _sha256(f"{directory}/{name}")}
        for name, count in zip(names, counts, strict=True)
    ]
    return {"num_examples": total, "shards": shards}


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


def make_metadata(
    source: str, image_shape: tuple[int, int, int], class_names: list[str], splits: dict[str, Any]
) -> dict[str, Any]:
    """metadata.json of a prepared dataset: its source, shape, classes and splits."""
    return {
        "format_version": FORMAT_VERSION,
        "source": source,
        "image_shape": list(image_shape),
        "num_classes": len(class_names),
        "class_names": class_names,
        "splits": splits,
        "created_by": f"trainer {__version__}",
    }


def load_metadata(directory: str) -> dict[str, Any]:
    """Reads and checks `metadata.json` of a prepared dataset.

    Raises:
        UsageError: naming the directory when the metadata is missing or malformed.
    """
    path = f"{directory.rstrip('/')}/{METADATA_FILE}"
    if not exists(path):
        raise UsageError(
            f"dataset {directory!r} has no {METADATA_FILE}; prepare it with `trainer-prepare --output {directory}`"
        )
    try:
        meta = read_json(path)
    except ValueError as err:
        raise UsageError(f"dataset metadata {path!r} is not valid JSON: {err}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"dataset metadata {path!r} is not a JSON object")
    return check_metadata(meta, path)


def _fail(path: str, field: str, value: Any, allowed: str) -> UsageError:
    shown = repr(value) if len(repr(value)) <= 120 else repr(value)[:117] + "..."
    return UsageError(f"dataset metadata {path!r}: {field} {shown} is not allowed; allowed: {allowed}")


def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_metadata(meta: dict[str, Any], path: str = METADATA_FILE) -> dict[str, Any]:
    """Checks metadata.json field by field, so that nothing TensorFlow cannot take reaches it.

    Raises:
        UsageError: naming the first field that is missing or out of range, and what is allowed.
    """
    from trainer.data import functions

    if functions.is_saved(meta):
        return functions.check_metadata(meta, path)
    missing = [k for k in ("format_version", "image_shape", "num_classes", "class_names", "splits") if k not in meta]
    if missing:
        raise UsageError(f"dataset metadata {path!r} lacks {', '.join(missing)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise _fail(path, "format_version", meta["format_version"], str(FORMAT_VERSION))
    shape = meta["image_shape"]
    if not (
        isinstance(shape, list)
        and len(shape) == 3
        and all(_count(d, 1) for d in shape)
        and shape[0] * shape[1] <= 4096**2
        and shape[2] in (1, 3, 4)
    ):
        raise _fail(
            path,
            "image_shape",
            shape,
            "[height, width, channels] with sides of at least 1 pixel, at most 16.7 M pixels, and 1, 3 or 4 channels",
        )
    if not _count(meta["num_classes"], 2) or meta["num_classes"] > 100_000:
        raise _fail(path, "num_classes", meta["num_classes"], "an integer from 2 to 100000")
    names = meta["class_names"]
    if not (
        isinstance(names, list)
        and len(names) == meta["num_classes"]
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    ):
        raise _fail(path, "class_names", names, f"{meta['num_classes']} distinct non-empty names (num_classes)")
    if not isinstance(meta["splits"], dict) or "train" not in meta["splits"]:
        raise _fail(path, "splits", meta["splits"], "an object with a 'train' split (and 'test')")
    for split, info in meta["splits"].items():
        shards = info.get("shards") if isinstance(info, dict) else None
        if (
            not isinstance(shards, list)
            or not shards
            or not all(
                isinstance(s, dict)
                and isinstance(s.get("file"), str)
                and "/" not in s["file"]
                and _count(s.get("num_examples"))
                and isinstance(s.get("sha256"), str)
                and len(s["sha256"]) == 64
                for s in shards
            )
        ):
            raise _fail(
                path,
                f"splits.{split}.shards",
                shards,
                "a list of {file, num_examples, sha256} with plain file names and SHA-256 hex digests",
            )
        total = info.get("num_examples")
        if not _count(total, 1) or total != sum(s["num_examples"] for s in shards):
            raise _fail(path, f"splits.{split}.num_examples", total, "at least 1, the sum of its shards' num_examples")
    return meta


def shard_paths(directory: str, meta: dict[str, Any], split: str) -> list[str]:
    """The paths of a split's shards."""
    if split not in meta["splits"]:
        raise UsageError(f"dataset {directory!r} has no split {split!r}; it has {', '.join(meta['splits'])}")
    return [f"{directory.rstrip('/')}/{s['file']}" for s in meta["splits"][split]["shards"]]


def verify_split(directory: str, meta: dict[str, Any], split: str) -> None:
    """Checks every shard of a split exists and matches its recorded SHA-256.

    Raises:
        UsageError: naming the first shard that is missing or whose checksum differs.
    """
    for shard, path in zip(meta["splits"][split]["shards"], shard_paths(directory, meta, split), strict=True):
        if not exists(path):
            raise UsageError(f"dataset shard {path!r} is missing")
        actual = _sha256(path)
        if actual != shard["sha256"]:
            raise UsageError(
                f"dataset shard {path!r} is corrupted: sha256 {actual[:12]}... differs from "
                f"{shard['sha256'][:12]}... in the metadata"
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


def read_arrays(directory: str, split: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Loads a whole split into memory (for evaluation and tests): images `[n, h, w, c]`, labels `[n]`, metadata."""
    import tensorflow as tf

    meta = load_metadata(directory)
    verify_split(directory, meta, split)
    shape = tuple(meta["image_shape"])
    ds = tf.data.TFRecordDataset(shard_paths(directory, meta, split)).map(decode_fn(shape)).batch(4096)
    images, labels = [], []
    for x, y in ds.as_numpy_iterator():
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels), meta
