import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.support.processes import run_module
from trainer.config.contract import DataConfig
from trainer.core.errors import UsageError
from trainer.data.idx import read_split, write_gz
from trainer.data.sources import parse_source, run, sample_dir
from trainer.data.tfrecords import load_metadata, read_arrays, verify_split
from trainer.records.dataset import DatasetMetadata

FASHION = "/usr/share/datasets/fashion-mnist"


def test_sample_is_balanced_real_digits(sample_data):
    meta = load_metadata(sample_data)
    assert meta.num_examples("train") == 4000
    assert meta.num_examples("test") == 1000
    assert meta.image_shape == (28, 28, 1) and meta.num_classes == 10
    assert meta.class_names == tuple(str(d) for d in range(10))
    assert [s.num_examples for s in meta.splits["train"].shards] == [1000] * 4
    images, labels, _ = read_arrays(sample_data, "train")
    assert np.bincount(labels).tolist() == [400] * 10
    assert images.dtype == np.uint8 and images.shape == (4000, 28, 28, 1)
    assert 0.1 < (images > 0).mean() < 0.3  # handwritten strokes on a black background, not noise


def _tiny_idx(directory, n_train=20, n_test=10):
    rng = np.random.default_rng(1)
    directory.mkdir(parents=True, exist_ok=True)
    write_gz(str(directory / "train-images-idx3-ubyte.gz"), rng.integers(0, 256, (n_train, 6, 5), dtype=np.uint8))
    write_gz(str(directory / "train-labels-idx1-ubyte.gz"), (np.arange(n_train) % 3).astype(np.uint8))
    write_gz(str(directory / "t10k-images-idx3-ubyte.gz"), rng.integers(0, 256, (n_test, 6, 5), dtype=np.uint8))
    write_gz(str(directory / "t10k-labels-idx1-ubyte.gz"), (np.arange(n_test) % 3).astype(np.uint8))
    return directory


def test_idx_source_with_slicing_and_class_names(tmp_path):
    src = _tiny_idx(tmp_path / "idx")
    meta = run(
        DataConfig(source=f"idx:{src}", num_shards=3, max_train_examples=11, class_names="a,b,c"), str(tmp_path / "out")
    )
    assert meta.num_examples("train") == 11
    assert [s.num_examples for s in meta.splits["train"].shards] == [4, 4, 3]
    assert meta.num_examples("test") == 10
    assert meta.image_shape == (6, 5, 1) and meta.class_names == ("a", "b", "c")
    images, labels, _ = read_arrays(str(tmp_path / "out"), "train")
    assert sorted(labels.tolist()) == sorted((np.arange(11) % 3).tolist())
    assert sorted(os.listdir(tmp_path)) == ["idx", "out"]


def test_failed_prepare_leaves_nothing(tmp_path):
    src = _tiny_idx(tmp_path / "idx")
    bad = src / "t10k-images-idx3-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:30])
    with pytest.raises(UsageError, match="t10k-images-idx3-ubyte.gz"):
        run(DataConfig(source=f"idx:{src}"), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["idx"]


def test_failed_prepare_keeps_the_previous_output(tmp_path):
    src = _tiny_idx(tmp_path / "idx")
    run(DataConfig(source=f"idx:{src}"), str(tmp_path / "out"))
    before = (tmp_path / "out" / "metadata.json").read_text()
    (src / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UsageError, match="has no train-labels-idx1-ubyte.gz"):
        run(DataConfig(source=f"idx:{src}"), str(tmp_path / "out"))
    assert (tmp_path / "out" / "metadata.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["idx", "out"]


def test_corrupted_shard_is_detected(tmp_path):
    out = tmp_path / "out"
    run(DataConfig(source=f"idx:{_tiny_idx(tmp_path / 'idx')}", num_shards=2), str(out))
    meta = load_metadata(str(out))
    shard = out / meta.splits["train"].shards[1].file
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"train-00001-of-00002.tfrecord' is corrupted"):
        verify_split(str(out), meta, "train")


def test_missing_metadata_is_named(tmp_path):
    with pytest.raises(UsageError, match="has no metadata.json; prepare it"):
        load_metadata(str(tmp_path))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("sample", ("idx", sample_dir())),
        ("idx:/x/y", ("idx", "/x/y")),
        ("idx:gs://b/mnist", ("idx", "gs://b/mnist")),
        ("mnist", ("tfds", "mnist")),
        ("tfds:fashion_mnist", ("tfds", "fashion_mnist")),
        ("tfds:mnist:3.0.1", ("tfds", "mnist:3.0.1")),
    ],
)
def test_source_forms(source, expected):
    assert parse_source(source) == expected


@pytest.mark.parametrize("source", ["", "idx:", "Not A Name", "http://example/x"])
def test_bad_source_is_refused(source):
    with pytest.raises(UsageError, match="is not recognised; allowed: 'sample', 'idx:DIR_OR_URI'"):
        parse_source(source)


def test_tfds_offline_fails_fast_with_what_to_pass_instead(tmp_path):
    start = time.monotonic()
    result = run_module(
        "trainer.prepare",
        "--source",
        "tfds:mnist",
        "--tfds-data-dir",
        str(tmp_path / "tfds"),
        "--output",
        str(tmp_path / "out"),
        "--network-timeout",
        "3",
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: TFDS dataset 'mnist' is not prepared")
    assert "--source sample" in last and "--source idx:DIR" in last
    assert elapsed < 45, f"took {elapsed:.0f}s"
    assert not (tmp_path / "out").exists()


def test_unknown_tfds_name(tmp_path):
    result = run_module("trainer.prepare", "--source", "tfds:no_such_dataset_xyz", "--output", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "TFDS dataset 'no_such_dataset_xyz' does not exist" in result.stderr.strip().splitlines()[-1]


def test_tfds_source_reads_a_prepared_tfds_dataset(tmp_path):
    """A real TFDS builder, prepared into a data_dir from the shipped digits, read through the tfds source."""
    import tensorflow_datasets as tfds

    from trainer.data.idx import read_split

    class ShippedDigits(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(shape=(28, 28, 1)),
                        "label": tfds.features.ClassLabel(names=[f"digit{i}" for i in range(10)]),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples("train"), "test": self._generate_examples("test")}

        def _generate_examples(self, split):
            images, labels = read_split(sample_dir(), split)
            for i in range(50):
                yield i, {"image": images[i][..., None], "label": int(labels[i])}

    data_dir = str(tmp_path / "tfds")
    ShippedDigits(data_dir=data_dir).download_and_prepare()
    meta = run(
        DataConfig(source="tfds:shipped_digits", tfds_data_dir=data_dir, max_train_examples=30), str(tmp_path / "out")
    )
    assert meta.num_examples("train") == 30 and meta.num_examples("test") == 50
    assert meta.class_names[3] == "digit3" and meta.image_shape == (28, 28, 1)
    images, labels, _ = read_arrays(str(tmp_path / "out"), "test")
    expected, expected_labels = read_split(sample_dir(), "test")
    np.testing.assert_array_equal(np.sort(labels), np.sort(expected_labels[:50].astype(np.int64)))
    assert images.astype(np.int64).sum() == expected[:50].astype(np.int64).sum()


@pytest.mark.slow
def test_debian_fashion_mnist_idx_files_read_unchanged(tmp_path):
    if not os.path.isdir(FASHION) and os.geteuid() != 0:
        pytest.skip(f"needs Debian's dataset-fashion-mnist at {FASHION}; make test installs it when run as root")
    assert os.path.isdir(FASHION), "make test installs Debian's dataset-fashion-mnist when run as root"
    result = run_module(
        "trainer.prepare",
        "--source",
        f"idx:{FASHION}",
        "--output",
        str(tmp_path / "fashion"),
        "--max-train-examples",
        "3000",
        "--max-test-examples",
        "500",
        "--class-names",
        "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot",
    )
    assert result.returncode == 0, result.stderr
    meta = DatasetMetadata.read(str(tmp_path / "fashion"))
    assert meta.num_examples("train") == 3000 and meta.num_examples("test") == 500
    assert meta.class_names[9] == "Ankle boot" and meta.image_shape == (28, 28, 1)
    _, labels, _ = read_arrays(str(tmp_path / "fashion"), "train")
    assert set(labels.tolist()) == set(range(10))


def _tree(directory):
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", ["sample", "idx"])
def test_two_processes_write_the_bytes_one_process_writes(kind, tmp_path, two_cpus, caplog):
    source = "sample" if kind == "sample" else f"idx:{_tiny_idx(tmp_path / 'idx', n_train=300, n_test=40)}"
    caplog.set_level("INFO", logger="trainer.data.writers")
    metas = [
        run(DataConfig(source=source, num_shards=3, prepare_workers=n), str(tmp_path / f"out-{n}")) for n in (1, 2)
    ]
    assert "with 1 process(es)" in caplog.text and "with 2 process(es)" in caplog.text
    assert metas[0] == metas[1]
    assert _tree(tmp_path / "out-1") == _tree(tmp_path / "out-2")
    images, labels, _ = read_arrays(str(tmp_path / "out-2"), "train")
    if kind == "idx":
        expected, expected_labels = read_split(str(tmp_path / "idx"), "train")
        assert sorted(labels.tolist()) == sorted(expected_labels.tolist()) and len(images) == len(expected) == 300


def test_a_writing_process_that_fails_fails_the_prepare_with_its_own_error(tmp_path, two_cpus):
    import multiprocessing

    from trainer.data.writers import SplitSource, write_splits

    chunks = [(np.zeros((4, 2, 2), np.uint8), np.arange(4))]
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FileExistsError, match="a-file"):
        write_splits(str(tmp_path / "a-file"), [SplitSource("train", chunks, 4, 2)], 2)
    assert multiprocessing.active_children() == []


def test_a_record_is_serialized_in_key_order_whichever_process_writes_it(tmp_path):
    """Protobuf orders a map as its hash table does, which differs from process to process; our records do not."""
    import tensorflow as tf

    from trainer.data.tfrecords import write_split

    write_split(str(tmp_path), "train", [(np.array([[[7]], [[8]]], np.uint8), 3)], 1, (2, 1, 1))
    record = next(iter(tf.data.TFRecordDataset(str(tmp_path / "train-00000-of-00001.tfrecord")))).numpy()
    image = b"\x0a\x0f\x0a\x05image\x12\x06\x0a\x04\x0a\x02\x07\x08"
    label = b"\x0a\x0e\x0a\x05label\x12\x05\x1a\x03\x0a\x01\x03"
    assert record == b"\x0a\x21" + image + label


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("0", "error: prepare_workers 0 is not allowed; allowed: an integer from 1 to 1024"),
        ("-2", "error: prepare_workers -2 is not allowed; allowed: an integer from 1 to 1024"),
        ("two", "error: argument --workers: prepare_workers 'two' is not an integer"),
    ],
)
def test_a_bad_workers_value_is_one_error_line(value, line, tmp_path, capsys):
    from trainer import prepare

    code = prepare.main(["--source", "sample", "--output", str(tmp_path / "out"), "--workers", value])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert list(tmp_path.iterdir()) == []


def test_shards_are_dealt_by_size_to_as_many_processes_as_the_cpu_allows():
    from trainer.core.cpus import CpuBudget
    from trainer.data.writers import SplitSource, deal, process_count

    sources = [SplitSource("train", [], 600_000, 4), SplitSource("test", [], 100_000, 1)]
    assert deal(sources, 2) == [
        [("train", 0, 4), ("train", 2, 4), ("test", 0, 1)],
        [("train", 1, 4), ("train", 3, 4)],
    ]
    assert deal([SplitSource("train", [], 70_000, 8), SplitSource("test", [], 10_000, 1)], 2) == [
        [("test", 0, 1), ("train", 2, 8), ("train", 4, 8), ("train", 6, 8)],
        [("train", 0, 8), ("train", 1, 8), ("train", 3, 8), ("train", 5, 8), ("train", 7, 8)],
    ], "the test split's shard weighed against the training shards: 36250 and 43750 examples"
    assert process_count(1024, sources, CpuBudget(2.5, "quota"))[0] == 2
    assert process_count(1024, sources, CpuBudget(16, "cores"))[0] == 3, "one process per 200000 examples"
    assert process_count(1, sources, CpuBudget(16, "cores"))[0] == 1
    assert process_count(1024, [SplitSource("train", [], 10**7, 1)], CpuBudget(16, "cores"))[0] == 1, "one shard"


def test_an_idx_split_is_read_in_chunks_and_checked_to_its_end(tmp_path, monkeypatch):
    from trainer.data import idx

    monkeypatch.setattr(idx, "CHUNK_BYTES", 64)
    src = _tiny_idx(tmp_path / "idx", n_train=50)
    split = idx.IdxSplit.open(str(src), "train")
    chunks = list(split.chunks())
    assert [len(labels) for _, labels in chunks] == [2] * 25, "64 bytes: two 6x5 images at a time"
    assert [len(labels) for _, labels in split.chunks(limit=5)] == [2, 2, 1]
    raw = tmp_path / "raw"
    raw.mkdir()
    images, labels = idx.read_split(str(src), "train")
    (raw / "train-images-idx3-ubyte").write_bytes(idx.encode_idx(images)[:-7])
    (raw / "train-labels-idx1-ubyte").write_bytes(idx.encode_idx(labels))
    with pytest.raises(
        UsageError, match=r"is truncated: shape \(50, 6, 5\) needs 1500 bytes after the header, found 1493"
    ):
        list(idx.IdxSplit.open(str(raw), "train").chunks())
    assert len(list(idx.IdxSplit.open(str(raw), "train").chunks(limit=10))) == 5, "a limit reads only what it keeps"


@pytest.mark.parametrize("write_bytes", [1, 100, 1 << 16])
def test_a_shard_written_in_pieces_holds_every_record_once_in_order_with_the_digest_of_its_bytes(
    write_bytes, tmp_path, monkeypatch
):
    """Records joined and written `WRITE_BYTES` at a time (1: one record a write) give one join's bytes."""
    from trainer.data import tfrecords
    from trainer.data.framing import frame, image_example

    monkeypatch.setattr(tfrecords, "WRITE_BYTES", write_bytes)
    images = np.random.default_rng(3).integers(0, 256, size=(40, 6, 5, 1), dtype=np.uint8)
    labels = np.arange(40) % 10
    with tfrecords.ShardWriter(str(tmp_path), "train", [0, 1], 2) as writer:
        writer.add(0, images[:25], labels[:25])
        writer.add(25, images[25:], labels[25:])
        shards = writer.finish()
    for k in (0, 1):
        pairs = zip(images[k::2], labels[k::2], strict=True)
        expected = b"".join(frame(image_example(i.tobytes(), int(y))) for i, y in pairs)
        written = (tmp_path / shards[k].file).read_bytes()
        assert written == expected, f"shard {k}"
        assert shards[k].sha256 == hashlib.sha256(expected).hexdigest() and shards[k].num_examples == 20


@pytest.mark.parametrize(("processes", "piece_bytes"), [(1, 150), (2, 150), (2, 30), (2, 1 << 20)])
def test_example_i_lands_in_shard_i_mod_n_in_source_order_across_many_small_chunks(
    processes, piece_bytes, tmp_path, two_cpus, monkeypatch
):
    """Chunks of 2 images (64 bytes): each chunk's cut into shards keeps every example's index in the split.

    With 2 processes the chunks are gathered into pieces of the ring: 5 images (a piece ends inside a chunk, the
    split's last piece is short), 1 image (fewer examples than shards), or the whole split.
    """
    import tensorflow as tf

    from trainer.data import idx, tfrecords, writers

    monkeypatch.setattr(idx, "CHUNK_BYTES", 64)
    monkeypatch.setattr(tfrecords, "CHUNK_BYTES", 64)
    monkeypatch.setattr(writers, "PIECE_BYTES", piece_bytes)
    src = _tiny_idx(tmp_path / "idx", n_train=50, n_test=10)
    expected, _ = read_split(str(src), "train")
    out = tmp_path / "out"
    run(DataConfig(source=f"idx:{src}", num_shards=3, prepare_workers=processes), str(out))
    meta = load_metadata(str(out))
    for k in range(3):
        path = str(out / tfrecords.shard_name("train", k, 3))
        images = [x.numpy() for x, _ in tf.data.TFRecordDataset(path).map(tfrecords.decode_fn(meta.image_shape))]
        assert np.array_equal(np.stack(images).reshape(-1, 6, 5), expected[k::3]), f"shard {k}: its examples in order"
        shard = meta.splits["train"].shards[k]
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == shard.sha256, f"shard {k}: its digest"


def test_a_writing_process_killed_by_a_signal_fails_the_prepare_with_128_plus_the_signal(tmp_path, two_cpus):
    """The OOM killer picks a writer (each holds a TensorFlow): the step ends 137, as a killed step does, not 1."""
    import multiprocessing
    import signal

    from trainer.core.errors import TaskFailedError, exit_code
    from trainer.data.writers import SplitSource, write_splits

    def chunks():
        yield np.zeros((2, 2, 2), np.uint8), np.arange(2)
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)
            child.join()
        for _ in range(3):
            yield np.zeros((2, 2, 2), np.uint8), np.arange(2)

    with pytest.raises(TaskFailedError, match=r"shard-writer-\d \(pid \d+\) was killed by signal 9") as caught:
        write_splits(str(tmp_path), [SplitSource("train", chunks(), 8, 2)], 2)
    assert exit_code(caught.value) == 137
    assert multiprocessing.active_children() == []


def test_a_read_error_inside_a_gzip_idx_file_keeps_its_own_kind(tmp_path):
    """A timeout while an IDX file streams is the store's fault (retried), not a broken gzip file (bad input)."""
    from trainer.data import idx

    src = _tiny_idx(tmp_path / "idx")
    (src / "broken.gz").write_bytes((src / "train-labels-idx1-ubyte.gz").read_bytes()[:-9])
    with pytest.raises(TimeoutError), idx._opened(str(src / "train-images-idx3-ubyte.gz")):
        raise TimeoutError("read timed out")
    with pytest.raises(UsageError, match="is not a complete gzip file"), idx._opened(str(src / "broken.gz")) as f:
        f.read()
