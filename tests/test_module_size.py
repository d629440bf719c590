"""Module mode at size: shapes checked when the data is prepared, a worker's share kept where it fits, your code's
errors split into bad input and transient ones, gates named as KFP names metrics and checked before training.

Users' shapes come from tests/user_code/shapes.py: token sequences of many lengths, images of two sizes, a table
whose spec leaves a length open.
"""

import dataclasses
import errno
import logging
import shutil

import pytest

from tests.support.processes import run_module
from trainer.config.contract import DataConfig, PublishConfig, TrainConfig
from trainer.config.gate import Gate
from trainer.core.errors import DeniedError, NoSpaceError, StoreUnavailableError, UsageError
from trainer.core.memory import (
    DISK_FRACTION,
    MEMORY_FRACTION,
    CacheChoice,
    MemoryLimit,
    Room,
    choose_cache,
    memory_limit,
    room,
    size,
)
from trainer.core.user_errors import TransientError, judge

SHAPES = "tests.user_code.shapes"
GiB = 1 << 30


def test_the_stated_fractions():
    assert (MEMORY_FRACTION, DISK_FRACTION) == (0.25, 0.5)


@pytest.mark.parametrize(
    "share, limit, disk_free, in_memory, where",
    [
        (2 * GiB, 8 * GiB, 0, 0, "memory"),  # exactly a quarter of the limit
        (2 * GiB + 1, 8 * GiB, 100 * GiB, 0, "disk"),
        (2 * GiB + 1, 8 * GiB, 4 * GiB, 0, "stream"),  # over half the free disk too
        (2 * GiB + 1, 8 * GiB, 0, 0, "stream"),  # no local disk
        (1 * GiB, 8 * GiB, 0, 1 * GiB + 1, "stream"),  # the training share took the budget
        (1 * GiB, 8 * GiB, 0, 1 * GiB, "memory"),
        (0, 1, 0, 0, "memory"),
    ],
)
def test_where_a_share_is_kept_follows_from_the_numbers(share, limit, disk_free, in_memory, where):
    choice = choose_cache(share, Room(MemoryLimit(limit, "test"), "/scratch", disk_free), in_memory)
    assert choice.where == where and choice.share_bytes == share


def test_the_decision_says_its_numbers_in_one_line():
    limit = MemoryLimit(8 * GiB, "cgroup v2 memory.max of /sys/fs/cgroup")
    line = choose_cache(3 * GiB, Room(limit, "/tmp", 5 * GiB)).describe("data cache: worker 1's share", limit)
    assert line == (
        "data cache: worker 1's share: 3.0 GiB; memory limit 8.0 GiB (cgroup v2 memory.max of /sys/fs/cgroup); "
        "stream: more than 0.25 of the limit (2.0 GiB left of it) and of 0.5 of the 5.0 GiB free in /tmp: read from "
        "the dataset every epoch"
    )
    assert choose_cache(1, Room(limit, "/tmp", 0)) == CacheChoice(
        "memory", 1, "it fits 0.25 of the limit (2.0 GiB left of it)"
    )


def _proc(tmp_path, cgroup, mounts):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("\n".join(cgroup) + "\n")
    info = [
        f"{30 + i} 25 0:{40 + i} {root} {point} rw shared:9 - {fstype} cgroup {options}"
        for i, (root, point, fstype, options) in enumerate(mounts)
    ]
    (proc / "self" / "mountinfo").write_text("\n".join(info) + "\n")
    return proc


def test_the_memory_limit_is_the_smallest_up_the_cgroup_v2_hierarchy(tmp_path):
    mount = tmp_path / "cgroup"
    (mount / "kubepods" / "pod1" / "c1").mkdir(parents=True)
    (mount / "kubepods" / "pod1" / "c1" / "memory.max").write_text("max\n")
    (mount / "kubepods" / "pod1" / "memory.max").write_text(f"{4 * GiB}\n")
    (mount / "kubepods" / "memory.max").write_text(f"{64 * GiB}\n")
    proc = _proc(tmp_path, ["0::/kubepods/pod1/c1"], [("/", mount, "cgroup2", "rw")])
    assert memory_limit(proc, env={}) == MemoryLimit(4 * GiB, f"cgroup v2 memory.max of {mount}/kubepods/pod1")


def test_cgroup_v1_in_a_container_and_its_no_limit_value(tmp_path):
    mount = tmp_path / "memory"
    mount.mkdir()
    (mount / "memory.limit_in_bytes").write_text("536870912\n")
    proc = _proc(tmp_path, ["4:memory:/docker/abc", "1:cpu:/"], [("/docker/abc", mount, "cgroup", "rw,memory")])
    assert memory_limit(proc, env={}) == MemoryLimit(512 << 20, f"cgroup v1 memory.limit_in_bytes of {mount}")
    (mount / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    machine = memory_limit(proc, env={})
    assert machine.source == "the machine's memory: no cgroup limit" and machine.bytes > 0


def test_trainer_memory_limit_overrides_the_cgroup_and_must_be_a_quantity(tmp_path):
    assert memory_limit(tmp_path, env={"TRAINER_MEMORY_LIMIT": "1.5Gi"}) == MemoryLimit(
        3 * GiB // 2, "TRAINER_MEMORY_LIMIT"
    )
    with pytest.raises(UsageError, match=r"^TRAINER_MEMORY_LIMIT 'lots' is not allowed; allowed: a Kubernetes"):
        memory_limit(tmp_path, env={"TRAINER_MEMORY_LIMIT": "lots"})


def test_trainer_disk_limit_caps_the_free_space_a_cache_may_take_and_must_be_a_quantity(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    limit = {"TRAINER_MEMORY_LIMIT": "1Mi"}
    unlimited = room(str(tmp_path), tmp_path, env=limit)
    assert (unlimited.disk_free, unlimited.disk()) == (free, f"the {size(free)} free in {tmp_path}")
    capped = room(str(tmp_path), tmp_path, env={**limit, "TRAINER_DISK_LIMIT": "1Mi"})
    assert capped.disk_free == min(free, 1 << 20)
    assert capped.disk() == f"the {size(capped.disk_free)} free in {tmp_path} (at most TRAINER_DISK_LIMIT)"
    share = 1 << 20
    assert choose_cache(share, unlimited).where == ("disk" if share <= DISK_FRACTION * free else "stream")
    choice = choose_cache(share, capped)
    assert choice.where == "stream"
    assert choice.reason.endswith(f"of {DISK_FRACTION:g} of {capped.disk()}: read from the dataset every epoch")
    for bad in ("lots", "0"):
        with pytest.raises(UsageError, match=rf"^TRAINER_DISK_LIMIT '{bad}' is not allowed; allowed: "):
            room(str(tmp_path), tmp_path, env={**limit, "TRAINER_DISK_LIMIT": bad})


@pytest.mark.parametrize("gate", ["pr-auc>=0.9", "val_auc >= 0.9", "f1<=0.5", "top-5-accuracy>=0.8", "a" * 64 + ">=1"])
def test_a_gate_names_its_metric_as_kfp_names_a_run_metric(gate):
    assert Gate.of(PublishConfig(gate=gate).gate, 0).metric == gate.split(">=")[0].split("<=")[0].strip()


@pytest.mark.parametrize("gate", ["pr-auc->=0.9", "1auc>=0.9", "_auc>=0.9", "pr.auc>=0.9", "a" * 65 + ">=1", "auc>0.9"])
def test_a_gate_on_a_name_kfp_refuses_is_refused_in_one_line(gate):
    with pytest.raises(UsageError) as err:
        PublishConfig(gate=gate)
    assert str(err.value).startswith(f"gate {gate!r} is not allowed; allowed: empty (accuracy >= min_accuracy), or")
    assert "letters, digits, '-' and '_', ending with a letter or digit, at most 64 characters" in str(err.value)


@pytest.mark.parametrize(
    "error, judged, named",
    [
        (OSError("Input/output error"), TransientError, "OSError: Input/output error"),
        (ConnectionResetError("reset by peer"), TransientError, "ConnectionResetError: reset by peer"),
        (TimeoutError("timed out"), TransientError, "TimeoutError: timed out"),
        (OSError(errno.EIO, "Input/output error"), TransientError, "OSError: [Errno 5] Input/output error"),
        (OSError(errno.ENOSPC, "No space left on device"), NoSpaceError, "no space left on the device (ENOSPC)"),
        (PermissionError(errno.EACCES, "Permission denied"), DeniedError, "permission denied (EACCES)"),
        (FileNotFoundError(errno.ENOENT, "No such file", "/d/x.csv"), UsageError, "FileNotFoundError: [Errno 2] No"),
        (ValueError("bad column"), UsageError, "ValueError: bad column"),
        (TypeError("takes 0 positional arguments"), UsageError, "TypeError: takes 0 positional arguments"),
        (AttributeError("no attribute 'shape'"), UsageError, "AttributeError: no attribute 'shape'"),
        (ImportError("no module named pandas"), UsageError, "ImportError: no module named pandas"),
    ],
)
def test_an_error_of_your_code_is_bad_input_a_storage_fault_or_transient(error, judged, named):
    found = judge(error, "source 'fn:m:datasets' failed when called with ('train')")
    assert type(found) is judged
    assert str(found).startswith(f"source 'fn:m:datasets' failed when called with ('train'): {named}")


# TensorFlow from here on: one process, under flock /tmp/heavy.lock.


@pytest.mark.parametrize(
    "function, line",
    [
        (
            "tokens",
            "gives features['tokens'] of shape [12] in example 0 of split 'train' but of shape [7] in example 2; "
            "allowed: one shape for every example of a feature: pad or cut sequences to one length",
        ),
        (
            "images",
            "gives features of shape [28, 28, 3] in example 0 of split 'train' but of shape [32, 32, 3] in example 4; "
            "allowed: one shape for every example of a feature",
        ),
    ],
)
def test_a_feature_of_varying_shape_is_refused_at_prepare_in_one_line_and_nothing_is_written(function, line, tmp_path):
    from trainer.data import sources

    with pytest.raises(UsageError) as err:
        sources.run(DataConfig(source=f"fn:{SHAPES}:{function}"), str(tmp_path / "data"))
    assert str(err.value).startswith(f"source 'fn:{SHAPES}:{function}' {line}")
    assert list(tmp_path.iterdir()) == [], "no dataset and no half-written temporary directory"


def test_an_image_of_another_shape_is_refused_when_shards_are_written(tmp_path):
    import numpy as np

    from trainer.data.tfrecords import write_split

    images = [(np.zeros((28, 28), "uint8"), 1), (np.zeros((28, 28, 1), "uint8"), 2), (np.zeros((32, 32), "uint8"), 3)]
    with pytest.raises(UsageError) as err:
        write_split(str(tmp_path), "train", images, 1, (28, 28, 1))
    assert str(err.value) == (
        "split 'train' has an image of shape [32, 32] (example 2) but the dataset's images are [28, 28, 1]; allowed: "
        "images of one shape (resize them to one size when you prepare them)"
    )


@pytest.fixture(scope="module")
def tabular(tmp_path_factory):
    """The table prepared once: (data directory, metadata)."""
    from trainer.data import sources

    data = tmp_path_factory.mktemp("tabular") / "data"
    return str(data), sources.run(DataConfig(source=f"fn:{SHAPES}:tabular"), str(data))


def test_an_open_spec_whose_examples_share_one_shape_is_read_back_with_that_shape(tabular):
    import tensorflow as tf

    from trainer.data import user_source

    data, meta = tabular
    features, label = user_source.load_split(data, meta, "train").element_spec
    assert features["visits"].shape == (4,) and features["age"].shape == () and features["ward"].dtype == tf.string
    assert meta.num_examples("train") == 256 and meta.num_examples("test") == 64
    assert user_source.load_split(data, meta, "test").cardinality().numpy() == 64


@pytest.fixture
def calls():
    from tests.user_code import shapes

    shapes.CALLS.clear()
    return shapes.CALLS


@pytest.mark.parametrize("function", ["flaky", "flaky_reading"])
def test_a_transient_error_of_the_function_is_retried_and_the_split_is_written_whole(
    function, calls, tabular, tmp_path, caplog
):
    import numpy as np

    from trainer.data import sources, user_source

    caplog.set_level(logging.WARNING, logger="trainer.core.user_errors")
    meta = sources.run(DataConfig(source=f"fn:{SHAPES}:{function}"), str(tmp_path / "data"))
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) == 2 and all(" failed, retrying in " in line for line in retries), retries
    if function == "flaky":
        assert retries[0].startswith(
            f"source 'fn:{SHAPES}:flaky' failed when called with ('train'): OSError: Input/output error reading "
            "gs://bucket/train.csv; attempt 1 of 5 failed"
        )
    else:
        assert retries[0].startswith(
            f"source 'fn:{SHAPES}:flaky_reading': reading split 'train': ConnectionResetError: connection reset by "
            "peer; attempt 1 of 5 failed"
        )
    reference_dir, reference = tabular
    for split in ("train", "test"):
        got = list(user_source.load_split(str(tmp_path / "data"), meta, split).as_numpy_iterator())
        want = list(user_source.load_split(reference_dir, reference, split).as_numpy_iterator())
        assert len(got) == len(want) == meta.num_examples(split)
        assert all(
            np.array_equal(a[0]["visits"], b[0]["visits"]) and a[1] == b[1] for a, b in zip(got, want, strict=True)
        )


@pytest.mark.parametrize(
    "function, code, line",
    [
        (
            f"{SHAPES}:always_down",
            142,
            f"error: source 'fn:{SHAPES}:always_down' failed when called with ('train'): ConnectionError: connection "
            f"refused by data.example:443 for train; a transient error of source 'fn:{SHAPES}:always_down', it failed "
            "the same way 5 times in ",
        ),
        (
            "tests.user_code.bad:raising",
            2,
            "error: source 'fn:tests.user_code.bad:raising' failed when called with ('train'): ValueError: no data for "
            "train today",
        ),
    ],
)
def test_trainer_prepare_ends_142_for_a_store_that_stays_down_and_2_for_a_programming_error(
    function, code, line, tmp_path
):
    result = run_module("trainer.prepare", "--source", f"fn:{function}", "--output", str(tmp_path / "d"))
    errors = [text for text in result.stderr.splitlines() if text.startswith("error:")]
    assert result.returncode == code and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(line), errors[0]
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


def _prepared(data, tmp_path, model_fn):
    from trainer.training import setup

    config = TrainConfig.from_settings(
        data_dir=data, model_dir=str(tmp_path / "model"), model_fn=model_fn, run_id="size-1", epochs=1, batch_size=32,
        checkpoint_dir=str(tmp_path / "checkpoints"),
    )  # fmt: skip
    return config, setup.prepare(config, chief=True)


def test_a_gate_on_a_metric_the_model_does_not_report_is_refused_before_the_first_epoch(tabular, tmp_path):
    import tensorflow as tf

    from trainer.data.inputs import examples
    from trainer.modeling.cnn import BuiltInCnn
    from trainer.training import setup

    data, meta = tabular
    config, prepared = _prepared(data, tmp_path, f"{SHAPES}:tabular_model")
    strategy = tf.distribute.get_strategy()
    with pytest.raises(UsageError) as err:
        setup.build(config, prepared, strategy, None, 0.01, 8, 256, None, gate=Gate.of("roc-auc>=0.9", 0))
    assert str(err.value) == (
        f"gate 'roc-auc >= 0.9' names metric 'roc-auc', which model_fn '{SHAPES}:tabular_model' does not report; "
        "allowed: a metric it reports: loss, pr-auc, accuracy (compile it with metrics=[...(name='roc-auc')])"
    )
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").rglob("*.index"))
    built = setup.build(config, prepared, strategy, None, 0.01, 8, 256, None, gate=Gate.of("pr-auc>=0.5", 0))
    history = built.model.fit(examples(data, meta, "train").batch(32), epochs=1, verbose=0)
    assert set(history.history) == {"loss", "pr-auc", "accuracy"}, "training keeps the metrics built for the check"
    with pytest.raises(UsageError, match=r"^gate 'auc >= 0.9' names metric 'auc', which the built-in CNN does not"):
        cnn = dataclasses.replace(prepared, kind=BuiltInCnn())
        setup.build(config, cnn, strategy, None, 0.01, 8, 256, None, gate=Gate.of("auc>=0.9", 0))


def test_a_model_function_failing_once_on_a_transient_error_is_retried(calls, tabular):
    import tensorflow as tf

    from trainer.modeling.user import build_user_model

    features = {"age": tf.TensorSpec([]), "visits": tf.TensorSpec([4]), "ward": tf.TensorSpec([], tf.string)}
    model = build_user_model(__import__(SHAPES, fromlist=["x"]).flaky_model, f"{SHAPES}:flaky_model", features)
    assert calls["flaky_model"] == 2 and model.output_names == ["sick"]


def test_a_model_function_whose_store_stays_down_ends_142(monkeypatch):
    import tensorflow as tf

    from trainer.core import faults
    from trainer.modeling.user import build_user_model

    monkeypatch.setattr(faults, "FIRST_DELAY", 0.01)

    def down(features):
        raise TimeoutError("read timed out: gs://bucket/weights.h5")

    with pytest.raises(StoreUnavailableError) as err:
        build_user_model(down, "m:down", tf.TensorSpec([3]))
    assert str(err.value).startswith(
        "model_fn 'm:down' failed when called with (TensorSpec): TimeoutError: read timed out: gs://bucket/weights.h5; "
        "a transient error of model_fn 'm:down', it failed the same way 5 times in "
    )
    assert err.value.code == 142
