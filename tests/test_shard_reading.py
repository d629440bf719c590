"""Reading image shards back: records of one length are cut, not parsed, and give what parsing gives.

Datasets shaped like users' own: grey digits (28x28x1, 10 classes), CIFAR-like (32x32x3, 100 classes), the
2 GB bench's 96x96x3, labels up to 127 (the largest one-byte varint), and ImageNet-like labels up to 999, whose
records differ in length and are parsed as Examples.
"""

import numpy as np
import pytest
import tensorflow as tf

from trainer.data import framing
from trainer.data.place import Place
from trainer.data.tfrecords import batched_map, fixed_length, pairs_of, parser, records_of, write_split


def _dataset(path, shape, classes, count, shards, seed=7):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
    labels = rng.integers(0, classes, count)
    labels[: min(count, classes)] = np.arange(min(count, classes))  # every label appears, the largest included
    split = write_split(str(path), "train", zip(images, labels, strict=True), shards, shape)
    return Place.of(str(path)), list(split.shards), images, labels


def _read(ds):
    images, labels = [], []
    for x, y in ds.batch(1000):
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


SHAPES = [((28, 28, 1), 10), ((32, 32, 3), 100), ((96, 96, 3), 10), ((28, 28, 1), 128)]


@pytest.mark.parametrize(("shape", "classes"), SHAPES)
@pytest.mark.parametrize("reads_aside", [True, False])
def test_records_of_one_length_are_cut_into_the_examples_in_the_order_they_were_written(
    tmp_path, shape, classes, reads_aside
):
    place, shards, images, labels = _dataset(tmp_path, shape, classes, 301, 7)
    assert fixed_length(place, shards, framing.fixed_layout(int(np.prod(shape)), framed=True))

    # Round-robin over every shard gives the examples back in the order they were written (example i in shard i % 7).
    got_images, got_labels = _read(pairs_of(place, shards, shape, interleaved=True, reads_aside=reads_aside))
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_labels.dtype == np.int64 and got_images.dtype == np.uint8

    file_after_file = np.concatenate([np.arange(s, 301, 7) for s in range(7)])
    got_images, got_labels = _read(pairs_of(place, shards, shape, interleaved=False, parallel=tf.data.AUTOTUNE))
    np.testing.assert_array_equal(got_images, images[file_after_file])
    np.testing.assert_array_equal(got_labels, labels[file_after_file])

    names = [s.file for s in shards]
    parsed_images, parsed_labels = _read(batched_map(records_of(place, names, interleaved=True), parser(shape)))
    np.testing.assert_array_equal(parsed_images, images)
    np.testing.assert_array_equal(parsed_labels, labels)


def test_labels_past_127_make_records_of_several_lengths_which_are_parsed(tmp_path):
    shape = (16, 16, 3)
    place, shards, images, labels = _dataset(tmp_path, shape, 1000, 1200, 4)
    assert not fixed_length(place, shards, framing.fixed_layout(int(np.prod(shape)), framed=True))
    got_images, got_labels = _read(pairs_of(place, shards, shape, interleaved=True, reads_aside=False))
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_labels.max() == 999


@pytest.mark.parametrize("where", ["head", "tail"])
def test_a_record_of_the_right_length_but_other_bytes_around_the_image_is_refused(tmp_path, where):
    shape = (28, 28, 1)
    place, shards, _, _ = _dataset(tmp_path, shape, 10, 50, 1)
    layout = framing.fixed_layout(int(np.prod(shape)), framed=True)
    path = tmp_path / shards[0].file
    data = bytearray(path.read_bytes())
    at = 3 * layout.record_bytes + (20 if where == "head" else layout.label_offset - 2)
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    refused = r"a record of \S+/train-00000-of-00001.tfrecord is not an image Example of shape \[28, 28, 1\]; prepare"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused):
        _read(pairs_of(place, shards, shape, interleaved=True))
