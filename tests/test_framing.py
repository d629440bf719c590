"""TFRecord framing and the image Example without TensorFlow: the same bytes as TensorFlow's writer, every check."""

import io

import numpy as np
import pytest
import tensorflow as tf

from trainer.data import framing


def _tf_example(image: bytes, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3), (96, 96, 3), (1, 1, 1), (5, 7, 4)])
@pytest.mark.parametrize("label", [0, 1, 9, 127, 128, 999, 2**31, 2**62, -1, -(2**63)])
def test_the_image_example_is_the_one_tensorflow_serializes(shape, label):
    image = np.random.default_rng(label % 1000).integers(0, 256, shape, dtype=np.uint8).tobytes()
    assert framing.image_example(image, label) == _tf_example(image, label)


def test_frames_are_the_bytes_tensorflows_writer_writes_and_its_reader_reads(tmp_path):
    rng = np.random.default_rng(3)
    records = [rng.bytes(n) for n in (0, 1, 11, 12, 127, 128, 5000, 70_000, 300_000)]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    ours = b"".join(framing.frame(r) for r in records)
    assert ours == (tmp_path / "tf.tfrecord").read_bytes()
    (tmp_path / "ours.tfrecord").write_bytes(ours)
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / "ours.tfrecord"))] == records


@pytest.mark.parametrize("chunk", [1, 7, 12, 13, 4096, 1 << 20])
def test_records_come_back_whole_whatever_the_chunks_cut(chunk):
    rng = np.random.default_rng(chunk)
    records = [rng.bytes(int(n)) for n in rng.integers(0, 3000, 50)]
    data = b"".join(framing.frame(r) for r in records)
    batches = list(framing.records(io.BytesIO(data), chunk, "x.tfrecord"))
    assert [r for batch in batches for r in batch] == records
    assert all(batches), "no empty batch is handed on"


def _damaged(at: int) -> bytes:
    data = bytearray(b"".join(framing.frame(bytes([i]) * 100) for i in range(3)))
    data[at] ^= 0x01
    return bytes(data)


def test_a_flipped_bit_in_a_length_or_in_the_data_is_named_with_its_record():
    record = framing.HEADER_BYTES + 100 + framing.FOOTER_BYTES
    with pytest.raises(framing.FramingError, match=f"s3://b/x: the length checksum of the record at byte {record}"):
        list(framing.records(io.BytesIO(_damaged(record + 2)), 64, "s3://b/x"))
    with pytest.raises(framing.FramingError, match=f"the data checksum of the record at byte {2 * record} differs"):
        list(framing.records(io.BytesIO(_damaged(2 * record + framing.HEADER_BYTES + 50)), 1 << 20, "x"))


def test_a_file_cut_off_inside_a_record_is_refused_not_shortened():
    data = b"".join(framing.frame(b"abc" * 50) for _ in range(4))
    with pytest.raises(framing.FramingError, match=r"a record is cut off at byte 498 \(80 bytes after the last"):
        list(framing.records(io.BytesIO(data[:-86]), 1000, "x"))


def test_the_chunks_of_a_workers_open_files_share_a_bound_however_many_files_it_has():
    from trainer.data.streamed import MIN_READ_BYTES, STREAM_BYTES, read_bytes

    MiB = 1 << 20
    assert [read_bytes(files) for files in (1, 8, 32, 64, 128, 256, 1000)] == [
        2 * MiB,
        2 * MiB,
        2 * MiB,
        MiB,
        MiB // 2,
        MiB // 4,
        MiB // 4,
    ]
    assert all(read_bytes(files) * files <= STREAM_BYTES for files in range(1, STREAM_BYTES // MIN_READ_BYTES + 1))
