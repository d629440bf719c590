"""TFRecord files and image Examples without TensorFlow: the bytes `tf.io.TFRecordWriter` writes, and their checks.

A TFRecord file is a sequence of records, each framed as TensorFlow's `core/lib/io/record_writer.cc` frames it:

    uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data

The masked CRC is `((crc >> 15) | (crc << 17)) + 0xa282ead8` (32 bits), computed by `google-crc32c` (C). Writing
and reading here need no TensorFlow, so a process that writes shards starts in a fraction of a second, and a file on
a store TensorFlow 2.21 cannot open (`s3://`) can be read through fsspec (`trainer.data.streamed`).

`image_example` serializes the one Example this project writes (`image`: the raw uint8 bytes, `label`: an int64)
exactly as `tf.train.Example(...).SerializeToString(deterministic=True)` does: the features' map in key order, the
label as a packed int64 list (`tests/test_framing.py` checks both against TensorFlow's own bytes).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Iterator
from typing import Protocol

import google_crc32c

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
HEADER_BYTES = _LENGTH.size + _CRC.size
FOOTER_BYTES = _CRC.size


class FramingError(ValueError):
    """A file's bytes are not whole TFRecord records: a bad checksum, or a record cut off at the end."""


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC-32C of `data`."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _header(length: int) -> bytes:
    """The bytes before a record's data of `length` bytes: the length and its masked CRC."""
    packed = _LENGTH.pack(length)
    return packed + _CRC.pack(masked_crc(packed))


def frame(record: bytes) -> bytes:
    """One record as a TFRecord file holds it."""
    return b"".join((_header(len(record)), record, _CRC.pack(masked_crc(record))))


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a uint64 (a negative int64 as its two's complement, 10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _head(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited protobuf field of `length` bytes."""
    return _varint(number << 3 | 2) + _varint(length)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _head(number, len(payload)) + payload


def _entry(key: bytes, feature: bytes) -> bytes:
    """One entry of `Features.feature` (map<string, Feature>): key 1, value 2."""
    return _field(1, _field(1, key) + _field(2, feature))


def image_example(image: bytes, label: int) -> bytes:
    """The serialized `tf.train.Example` of one image (raw uint8 bytes) and its label.

    Feature fields (`feature.proto`): `bytes_list` 1, `int64_list` 3, each list's `value` 1 (int64 packed). All but
    the image's bytes depend only on its length and the label (`_around`), so they are built once per pair.
    """
    head, tail = _around(len(image), label)
    return b"".join((head, image, tail))


@functools.lru_cache(maxsize=4096)
def _around(size: int, label: int) -> tuple[bytes, bytes]:
    """The bytes of an image Example before the image's `size` bytes, and after them."""
    value = _head(1, size)  # BytesList.value
    bytes_list = _head(1, len(value) + size)  # Feature.bytes_list
    feature = _head(2, len(bytes_list) + len(value) + size)  # the map entry's value
    key = _field(1, b"image")
    entry = _head(1, len(key) + len(feature) + len(bytes_list) + len(value) + size)  # Features.feature
    tail = _entry(b"label", _field(3, _field(1, _varint(label))))
    image_entry = len(entry) + len(key) + len(feature) + len(bytes_list) + len(value) + size
    features = _head(1, image_entry + len(tail))  # Example.features
    return b"".join((features, entry, key, feature, bytes_list, value)), tail


@dataclasses.dataclass(frozen=True)
class FixedLayout:
    """Where the image and the label are in each record of a file of image Examples that all have one length.

    Every image Example of one image size whose label is 0 to 127 (a one-byte varint) is the same bytes around the
    image and the label (`_around`), so such a file is records of one length: `head`, the image, `tail`, the label's
    byte, then `footer_bytes` (the data's CRC when framed). Framed, the head begins with the length and its CRC,
    which are the same for every record too.
    """

    head: bytes
    image_bytes: int
    tail: bytes
    footer_bytes: int

    @property
    def record_bytes(self) -> int:
        """The length of every record."""
        return len(self.head) + self.image_bytes + len(self.tail) + 1 + self.footer_bytes

    @property
    def label_offset(self) -> int:
        """Where the label's byte is in a record."""
        return len(self.head) + self.image_bytes + len(self.tail)


def fixed_layout(image_bytes: int, framed: bool) -> FixedLayout:
    """The layout of image Examples of `image_bytes` with a label of 0 to 127: framed records, or their data alone.

    The shortest an image Example of that size can be: a file of `n` of them that is `n * record_bytes` long holds
    only such records (any other label is a longer varint).
    """
    head, tail = _around(image_bytes, 0)
    if framed:
        head = _header(len(head) + image_bytes + len(tail)) + head
    return FixedLayout(head, image_bytes, tail[:-1], FOOTER_BYTES if framed else 0)


class Readable(Protocol):
    """What `records` reads from: `read(n)` returns up to `n` bytes, fewer only at the end."""

    def read(self, n: int) -> bytes:
        """Up to `n` bytes; fewer only at the end."""


def records(source: Readable, chunk_bytes: int, name: str) -> Iterator[list[bytes]]:
    """The records of a TFRecord file read in chunks of `chunk_bytes`, a list per chunk, every checksum checked.

    Raises:
        FramingError: naming `name` and the byte where a checksum differs or a record is cut off.
    """
    buffer = b""
    offset = 0  # of buffer[0] in the file
    ended = False
    while not ended:
        chunk = source.read(chunk_bytes)
        ended = len(chunk) < chunk_bytes
        buffer += chunk
        found, used = _whole(buffer, offset, name)
        if found:
            yield found
        buffer, offset = buffer[used:], offset + used
    if buffer:
        raise FramingError(f"{name}: a record is cut off at byte {offset} ({len(buffer)} bytes after the last record)")


def _whole(buffer: bytes, offset: int, name: str) -> tuple[list[bytes], int]:
    """The whole records at the start of `buffer`, and how many of its bytes they take."""
    found, at = [], 0
    while len(buffer) - at >= HEADER_BYTES:
        length_bytes = buffer[at : at + _LENGTH.size]
        if _CRC.unpack_from(buffer, at + _LENGTH.size)[0] != masked_crc(length_bytes):
            raise FramingError(f"{name}: the length checksum of the record at byte {offset + at} differs")
        (length,) = _LENGTH.unpack(length_bytes)
        end = at + HEADER_BYTES + length + FOOTER_BYTES
        if end > len(buffer):
            break
        data = buffer[at + HEADER_BYTES : end - FOOTER_BYTES]
        if _CRC.unpack_from(buffer, end - FOOTER_BYTES)[0] != masked_crc(data):
            raise FramingError(f"{name}: the data checksum of the record at byte {offset + at} differs")
        found.append(data)
        at = end
    return found, at
