import gzip

import numpy as np
import pytest

from trainer.core.errors import UsageError
from trainer.data.idx import IdxFile, encode_idx, read_split, write_gz


def _write_split(directory, images, labels, split="train"):
    stems = {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }
    write_gz(str(directory / f"{stems[split][0]}.gz"), images)
    write_gz(str(directory / f"{stems[split][1]}.gz"), labels)


def test_round_trip_of_a_file_written_here(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 28, 28), dtype=np.uint8)
    labels = np.arange(7, dtype=np.uint8)
    _write_split(tmp_path, images, labels)
    got_images, got_labels = read_split(str(tmp_path), "train")
    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)


def test_header_bytes_are_the_mnist_format():
    data = encode_idx(np.zeros((2, 3, 4), dtype=np.uint8))
    assert data[:16] == bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4])
    assert len(data) == 16 + 24


def test_uncompressed_files_are_read_too(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(encode_idx(np.ones((2, 5, 5), dtype=np.uint8)))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(encode_idx(np.array([3, 4], dtype=np.uint8)))
    images, labels = read_split(str(tmp_path), "test")
    assert images.shape == (2, 5, 5) and labels.tolist() == [3, 4]


def test_wrong_magic_is_named(tmp_path, monkeypatch):
    data = bytearray(encode_idx(np.zeros((1, 2, 2), dtype=np.uint8)))
    data[2] = 0x0D
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.idx").write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"'x.idx' has magic number 0x00000d03; allowed: 0x00000801"):
        IdxFile.open("x.idx")


def test_truncated_body_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "y").write_bytes(encode_idx(np.zeros((3, 4, 4), dtype=np.uint8))[:-5])
    with pytest.raises(
        UsageError, match=r"'y' is truncated: shape \(3, 4, 4\) needs 48 bytes after the header, found 43"
    ):
        list(IdxFile.open("y").chunks(3))


def test_truncated_gzip_is_named(tmp_path):
    _write_split(tmp_path, np.zeros((4, 3, 3), dtype=np.uint8), np.zeros(4, dtype=np.uint8))
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(UsageError, match="is not a complete gzip file"):
        read_split(str(tmp_path), "train")


@pytest.mark.parametrize(
    ("at", "why"), [(20, "Invalid deflate block"), (-1, "CRC check failed")], ids=["deflate-block", "checksum"]
)
def test_a_gzip_file_corrupt_inside_is_named_and_one_intact_gives_the_same_bytes_as_the_standard_library(
    tmp_path, at, why
):
    """Bytes overwritten in the first deflate block (ISA-L's own error) or in the middle (the CRC no longer matches)."""
    import gzip

    rng = np.random.default_rng(7)
    images = rng.integers(0, 4, size=(400, 28, 28), dtype=np.uint8)
    _write_split(tmp_path, images, np.zeros(400, dtype=np.uint8))
    path = tmp_path / "train-images-idx3-ubyte.gz"
    got, _ = read_split(str(tmp_path), "train")
    assert got.tobytes() == gzip.decompress(path.read_bytes())[16:]
    body = bytearray(path.read_bytes())
    at = len(body) // 2 if at < 0 else at
    body[at : at + 64] = bytes(64 * [0xFF])
    path.write_bytes(bytes(body))
    with pytest.raises(UsageError, match=rf"train-images-idx3-ubyte.gz' is not a complete gzip file \(.*{why}.*\)"):
        read_split(str(tmp_path), "train")


def test_missing_file_names_what_is_needed(tmp_path):
    write_gz(str(tmp_path / "train-images-idx3-ubyte.gz"), np.zeros((1, 2, 2), dtype=np.uint8))
    with pytest.raises(UsageError, match="has no train-labels-idx1-ubyte.gz"):
        read_split(str(tmp_path), "train")


def test_label_count_mismatch(tmp_path):
    _write_split(tmp_path, np.zeros((4, 3, 3), dtype=np.uint8), np.zeros(3, dtype=np.uint8))
    with pytest.raises(UsageError, match="holds \\(3,\\) labels for 4 images"):
        read_split(str(tmp_path), "train")


def test_gzip_output_is_reproducible(tmp_path):
    array = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    write_gz(str(tmp_path / "a.gz"), array)
    write_gz(str(tmp_path / "b.gz"), array)
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == encode_idx(array)
