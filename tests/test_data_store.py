"""A prepared dataset whose shards live in an object store (`data_uri`), read by each worker from there.

moto's S3 server (IAM enforced) stands in for KFP's SeaweedFS; requests go through `FaultyProxy`, which records what
every answer carried, so the bytes a worker read are counted from the wire, not from the reader's own accounting.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.standins.s3 import BUCKET, FaultyProxy, S3Server
from trainer import steps
from trainer.config.contract import DataConfig
from trainer.core.errors import DeniedError, StoreUnavailableError, UsageError
from trainer.core.runs import run_key
from trainer.data import readers, sources
from trainer.data.tfrecords import load_metadata, read_arrays

pytestmark = pytest.mark.slow  # a server process


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def keys(s3, monkeypatch):
    for name, value in s3.publisher.env().items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.fixture
def proxy(s3):
    proxy = FaultyProxy(s3.url)
    yield proxy
    proxy.stop()


def _prepare(tmp_path, name, endpoint, workers=1, **settings):
    config = DataConfig(source="sample", data_uri=f"s3://{BUCKET}/{name}", prepare_workers=workers, **settings)
    out = tmp_path / name
    return sources.run(config, str(out), endpoint), str(out)


def test_the_shards_go_straight_to_the_store_byte_for_byte_and_the_artifact_holds_only_metadata(
    keys, tmp_path, sample_data, two_cpus
):
    local = load_metadata(sample_data)
    for workers in (1, 2):
        meta, out = _prepare(tmp_path, f"straight-{workers}", keys.url, workers, max_train_examples=4000)
        assert os.listdir(out) == ["metadata.json"]
        assert meta.location == f"s3://{BUCKET}/straight-{workers}" and meta.endpoint == keys.url
        assert meta.splits == local.splits, "the same shards (names, counts, SHA-256) as prepared on a local disk"
        for shard in local.splits["train"].shards:
            assert keys.read(f"straight-{workers}/{shard.file}") == open(f"{sample_data}/{shard.file}", "rb").read()
        placed = json.loads(keys.read(f"straight-{workers}/metadata.json"))
        assert placed == json.loads(open(f"{out}/metadata.json").read())
        assert placed["location"] == meta.location


def test_each_worker_reads_only_its_own_shards_from_the_store_in_the_order_a_local_copy_gives(
    keys, proxy, tmp_path, sample_data
):
    meta, out = _prepare(tmp_path, "shares", proxy.url)
    local = load_metadata(sample_data)
    dataset_bytes = sum(
        keys.client(keys.publisher).head_object(Bucket=BUCKET, Key=f"shares/{s.file}")["ContentLength"]
        for s in meta.splits["train"].shards
    )
    for rank in (0, 1):
        proxy.answered.clear()
        reader = readers.of(out, meta)
        reader.verify("train", 2, rank)
        got = list(reader.share("train", 2, rank).stored().as_numpy_iterator())
        want = list(readers.of(sample_data, local).share("train", 2, rank).stored().as_numpy_iterator())
        assert len(got) == len(want) == 2000
        for (x, y), (wx, wy) in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, wx)
            assert y == wy
        read = {path for method, path, _ in proxy.answered if method == "GET"}
        assert read == {f"/{BUCKET}/shares/train-{i:05d}-of-00004.tfrecord" for i in (rank, rank + 2)}
        fetched = sum(n for method, _, n in proxy.answered if method == "GET")
        assert fetched == 2 * (dataset_bytes // 2), "its share, read twice: its checksums, then its records"


def test_evaluation_reads_the_test_split_from_the_store(keys, tmp_path, sample_data):
    _, out = _prepare(tmp_path, "evaluated", keys.url)
    images, labels, meta = read_arrays(out, "test")
    want_images, want_labels, _ = read_arrays(sample_data, "test")
    np.testing.assert_array_equal(images, want_images)
    np.testing.assert_array_equal(labels, want_labels)
    assert meta.location.endswith("/evaluated")


def test_a_corrupted_or_missing_shard_in_the_store_is_refused_before_training(keys, tmp_path):
    meta, out = _prepare(tmp_path, "damaged", keys.url)
    client = keys.client(keys.publisher)
    name = meta.splits["train"].shards[1].file
    data = bytearray(keys.read(f"damaged/{name}"))
    data[1000] ^= 0x01
    client.put_object(Bucket=BUCKET, Key=f"damaged/{name}", Body=bytes(data))
    reader = readers.of(out, meta)
    reader.verify("train", 2, 0)  # worker 0's share is shards 0 and 2
    with pytest.raises(UsageError, match=rf"dataset shard 's3://{BUCKET}/damaged/{name}' is corrupted"):
        reader.verify("train", 2, 1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{name}: the data checksum of the record at byte"):
        list(reader.share("train", 2, 1).stored().as_numpy_iterator())
    client.delete_object(Bucket=BUCKET, Key=f"damaged/{name}")
    with pytest.raises(UsageError, match=rf"dataset shard 's3://{BUCKET}/damaged/{name}' is missing"):
        reader.verify("train")


def test_a_ranged_read_that_fails_is_retried_and_one_that_keeps_failing_ends_142(keys, s3, tmp_path, monkeypatch):
    from trainer.core import faults

    monkeypatch.setattr(faults, "backoff", lambda attempt: 0.01)
    meta, out = _prepare(tmp_path, "flaky", s3.url)
    failed: list[str] = []

    def once(request):
        if request.method == "GET" and "train-00001" in request.path and not failed:
            failed.append(request.path)
            return True
        return False

    flaky = FaultyProxy(s3.url, once)
    down = FaultyProxy(s3.url, lambda request: request.method == "GET" and "train-00001" in request.path)
    try:
        reader = readers.of(out, meta.placed(meta.location, flaky.url))
        assert len(list(reader.share("train", 2, 1).stored().as_numpy_iterator())) == 2000
        assert failed, "one GET of the shard failed and was retried"
        reader = readers.of(out, meta.placed(meta.location, down.url))
        with pytest.raises(
            StoreUnavailableError, match=r"read 'models/flaky/train-00001-of-00004.tfrecord'.*5 attempts"
        ):
            reader.verify("train", 2, 1)
    finally:
        flaky.stop()
        down.stop()


def test_a_part_that_fails_once_is_sent_again_and_keys_that_may_not_write_leave_nothing(s3, tmp_path, monkeypatch):
    from trainer.data.idx import write_gz

    rng = np.random.default_rng(5)
    idx = tmp_path / "idx"
    idx.mkdir()
    for prefix, count in (("train", 12_000), ("t10k", 10)):
        write_gz(str(idx / f"{prefix}-images-idx3-ubyte.gz"), rng.integers(0, 256, (count, 28, 28), dtype=np.uint8))
        write_gz(str(idx / f"{prefix}-labels-idx1-ubyte.gz"), (np.arange(count) % 10).astype(np.uint8))
    failed: list[str] = []

    def first_part(request):
        if request.method == "PUT" and "partNumber" in request.full_path and not failed:
            failed.append(request.full_path)
            return True
        return False

    proxy = FaultyProxy(s3.url, first_part)
    try:
        for name, value in s3.publisher.env().items():
            monkeypatch.setenv(name, value)
        big = DataConfig(source=f"idx:{idx}", data_uri=f"s3://{BUCKET}/parts", num_shards=1)
        meta = sources.run(big, str(tmp_path / "parts"), proxy.url)
    finally:
        proxy.stop()
    assert failed, "a 9.8 MB shard goes up in two parts (8 MiB each), the first of them twice"
    written = s3.read("parts/train-00000-of-00001.tfrecord")
    assert len(written) > 8 << 20
    local = sources.run(DataConfig(source=f"idx:{idx}", num_shards=1), str(tmp_path / "local"))
    assert meta.splits == local.splits
    assert written == (tmp_path / "local" / "train-00000-of-00001.tfrecord").read_bytes()
    for name, value in s3.reader.env().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DeniedError, match=rf"s3://{BUCKET} at {s3.url} refused to (write|delete) 'models/refused"):
        sources.run(DataConfig(source="sample", data_uri=f"s3://{BUCKET}/refused"), str(tmp_path / "refused"), s3.url)
    assert s3.keys("refused") == [] and not (tmp_path / "refused").exists()


def test_a_pipeline_run_writes_under_its_own_run_key_and_records_where(keys, tmp_path, monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    places = []
    for run in ("nightly-1", "nightly-2"):
        counts = steps.prepare_data(
            str(tmp_path / run), "sample", 0, 0, 4, data_uri=f"s3://{BUCKET}/datasets", run_id=run, s3_endpoint=keys.url
        )
        assert counts["location"] == f"s3://{BUCKET}/datasets/{run_key(run)}"
        places.append(counts["location"])
    assert len(set(places)) == 2
    assert len(keys.keys(f"datasets/{run_key('nightly-1')}/")) == 6, "4 + 1 shards and metadata.json"


def test_your_functions_data_and_the_parameter_server_strategy_refuse_a_store_they_cannot_use(keys, tmp_path):
    with pytest.raises(UsageError, match=r"data_uri 's3://models/fn' is not allowed with source 'fn:"):
        sources.run(
            DataConfig(source="fn:tests.user_code.shapes:images", data_uri="s3://models/fn"), str(tmp_path / "fn")
        )
    from trainer.data.place import Place
    from trainer.data.streamed import check_graph_readable

    with pytest.raises(UsageError, match=r"parameter_server reads the dataset at 's3://models/x' on its workers"):
        check_graph_readable(Place.of("s3://models/x"), "parameter_server")
    check_graph_readable(Place.of("gs://models/x"), "parameter_server")
    check_graph_readable(Place.of(str(tmp_path)), "parameter_server")


def test_a_share_over_its_limits_trains_streamed_from_the_store_and_says_what_it_read(keys, tmp_path, sample_data):
    from tests.support.processes import run_module
    from trainer.evaluation.metrics import evaluate

    meta, out = _prepare(tmp_path, "streamed", keys.url)
    share = sum(
        keys.client(keys.publisher).head_object(Bucket=BUCKET, Key=f"streamed/{s.file}")["ContentLength"]
        for s in meta.splits["train"].shards
    )
    env = {**keys.publisher.env(), "TRAINER_MEMORY_LIMIT": "1Mi", "TRAINER_DISK_LIMIT": "1"}
    model = tmp_path / "model"
    result = run_module("trainer.train", "--data", out, "--model-dir", str(model), "--epochs", "2", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "data cache: worker 0's share of the train split" in log and "; stream: more than 0.25" in log
    assert "(at most TRAINER_DISK_LIMIT): read from the dataset every epoch" in log
    assert "first training step done" in log
    said = [line for line in log.splitlines() if "read through fsspec by this process so far" in line]
    assert len(said) == 2, "one line per epoch"
    assert f"of 4 files ({share} bytes) counted once" in said[-1], "every train shard read, each counted once"
    assert evaluate(str(model), out).accuracy >= 0.85
