"""Reading and writing MNIST-format IDX files (`train-images-idx3-ubyte.gz` ...), locally or at any tf.io.gfile URI.

Parsing is plain numpy; only opening a non-local URI needs TensorFlow, and then only its gfile module.
"""

from __future__ import annotations

import gzip
import io
import os
import struct
from collections.abc import Callable

import numpy as np

from trainer.core.errors import UsageError
from trainer.core.files import write_bytes

UBYTE = 0x08
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _is_local(path: str) -> bool:
    return "://" not in path


def _exists(path: str) -> bool:
    if _is_local(path):
        return os.path.exists(path)
    import tensorflow as tf

    return tf.io.gfile.exists(path)


def _read_bytes(path: str) -> bytes:
    if _is_local(path):
        with open(path, "rb") as f:
            data = f.read()
    else:
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise UsageError(f"IDX file {path!r} is not a complete gzip file ({err})") from None
    return data


def parse_idx(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Parses an unsigned-byte IDX payload into an array of its declared shape.

    Raises:
        UsageError: naming the file on a wrong magic number, an unsupported element type or a truncated body.
    """
    if len(data) < 4:
        raise UsageError(f"IDX file {name!r} is truncated: {len(data)} bytes, the header alone needs 4")
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != UBYTE or not 1 <= ndim <= 4:
        raise UsageError(
            f"IDX file {name!r} has magic number 0x{int.from_bytes(data[:4], 'big'):08x}; "
            "allowed: 0x00000801 to 0x00000804 (unsigned bytes, 1 to 4 dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise UsageError(f"IDX file {name!r} is truncated inside its header ({len(data)} of {header} bytes)")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    body = len(data) - header
    if body != expected:
        word = "truncated" if body < expected else "longer than declared"
        raise UsageError(
            f"IDX file {name!r} is {word}: shape {shape} needs {expected} bytes after the header, found {body}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def encode_idx(array: np.ndarray) -> bytes:
    """The IDX bytes of a uint8 array (the inverse of `parse_idx`)."""
    if array.dtype != np.uint8 or not 1 <= array.ndim <= 4:
        raise UsageError(f"IDX needs a uint8 array of 1 to 4 dimensions, got {array.dtype} with {array.ndim}")
    header = struct.pack(">HBB", 0, UBYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def _find(directory: str, stem: str, opener: Callable[[str], bool]) -> str:
    for candidate in (f"{stem}.gz", stem):
        path = directory.rstrip("/") + "/" + candidate
        if opener(path):
            return path
    needed = ", ".join(s for pair in SPLIT_FILES.values() for s in pair)
    raise UsageError(f"IDX directory {directory!r} has no {stem}.gz (or {stem}); it needs {needed}")


def read_split(directory: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Reads one split (`train` or `test`) of an IDX directory: images `[n, h, w]` and labels `[n]`."""
    if split not in SPLIT_FILES:
        raise UsageError(f"split {split!r} is unknown for IDX data; allowed: {', '.join(SPLIT_FILES)}")
    if not _exists(directory):
        raise UsageError(f"IDX directory {directory!r} does not exist")
    image_stem, label_stem = SPLIT_FILES[split]
    image_path = _find(directory, image_stem, _exists)
    label_path = _find(directory, label_stem, _exists)
    images = parse_idx(_read_bytes(image_path), image_path)
    labels = parse_idx(_read_bytes(label_path), label_path)
    if images.ndim != 3:
        raise UsageError(
            f"IDX file {image_path!r} holds a {images.ndim}-dimensional array; images need 3 (count, height, width)"
        )
    if labels.ndim != 1 or len(labels) != len(images):
        raise UsageError(
            f"IDX file {label_path!r} holds {labels.shape} labels for {len(images)} images in {image_path!r}"
        )
    return images, labels


def write_gz(path: str, array: np.ndarray) -> None:
    """Writes an array as a gzip-compressed IDX file, byte-for-byte reproducible (no timestamp)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, filename="") as gz:
        gz.write(encode_idx(array))
    write_bytes(path, buffer.getvalue())
