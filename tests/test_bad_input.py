"""Every entry point checks its input at the boundary: one line naming the value and what is allowed, exit code 2,
nothing written. The table spans the trainer CLIs, the pipeline CLI and the component bodies.
"""

import json
import os
import shutil

import numpy as np
import pytest

from tests.bad_input_pipeline import PIPELINE_CASES
from tests.support.paths import SAMPLE_DIR
from trainer import evaluate, launch, prepare, train
from trainer.data.idx import encode_idx


def _metadata(root, sample_data, name, change):
    directory = root / name
    shutil.copytree(sample_data, directory)
    meta = json.loads((directory / "metadata.json").read_text())
    change(meta)
    (directory / "metadata.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def bad(tmp_path_factory, sample_data):
    """A directory of broken inputs, each made the way it happens in practice."""
    root = tmp_path_factory.mktemp("bad")
    missing = root / "idx-missing"
    shutil.copytree(SAMPLE_DIR, missing)
    (missing / "t10k-labels-idx1-ubyte.gz").unlink()
    truncated = root / "idx-truncated"
    shutil.copytree(SAMPLE_DIR, truncated)
    (truncated / "train-labels-idx1-ubyte.gz").write_bytes(
        (truncated / "train-labels-idx1-ubyte.gz").read_bytes()[:200]
    )
    magic = root / "idx-magic"
    shutil.copytree(SAMPLE_DIR, magic)
    payload = bytearray(encode_idx(np.zeros((4, 28, 28), dtype=np.uint8)))
    payload[2] = 0x0C
    (magic / "t10k-images-idx3-ubyte.gz").unlink()
    (magic / "t10k-images-idx3-ubyte").write_bytes(bytes(payload))
    corrupted = root / "corrupted"
    shutil.copytree(sample_data, corrupted)
    shard = corrupted / "train-00002-of-00004.tfrecord"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0x01
    shard.write_bytes(bytes(data))
    no_meta = root / "no-metadata"
    shutil.copytree(sample_data, no_meta)
    (no_meta / "metadata.json").unlink()
    _metadata(root, sample_data, "zero-channels", lambda m: m.update(image_shape=[28, 28, 0]))
    _metadata(root, sample_data, "names-short", lambda m: m.update(class_names=["0", "1"]))
    _metadata(root, sample_data, "count-negative", lambda m: m["splits"]["train"].update(num_examples=-4000))
    _metadata(root, sample_data, "shard-path", lambda m: m["splits"]["train"]["shards"][0].update(file="../x.tfrecord"))
    _metadata(root, sample_data, "one-class", lambda m: m.update(num_classes=1, class_names=["0"]))
    (root / "not-a-model").mkdir()
    (root / "not-a-model" / "history.json").write_text("{}")
    (root / "no-history" / "saved_model").mkdir(parents=True)
    (root / "a-file").write_text("x")
    cluster = root / "cluster"
    cluster.mkdir()
    (cluster / "cluster.json").write_text(
        json.dumps({"cluster": {"worker": ["localhost:1"]}, "control": None, "mode": "local"})
    )
    return root


def _train(b, s, *extra, out="model"):
    return train.main, ["--data", s, "--model-dir", str(b / "out" / out), *extra], out


def _tf(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _prepare(b, source, *extra, out="prepared"):
    return prepare.main, ["--source", source, "--output", str(b / "out" / out), *extra], out


CASES = {
    # trainer-train: the contract's settings
    "batch size zero": lambda b, s: (
        *_train(b, s, "--batch-size", "0"),
        "batch_size 0 is not allowed; allowed: an integer from 1 to 65536",
    ),
    "batch size negative": lambda b, s: (*_train(b, s, "--batch-size", "-8"), "batch_size -8 is not allowed"),
    "epochs zero": lambda b, s: (
        *_train(b, s, "--epochs", "0"),
        "epochs 0 is not allowed; allowed: an integer from 1 to 100000",
    ),
    "epochs not a number": lambda b, s: (
        *_train(b, s, "--epochs", "ten"),
        "argument --epochs: epochs 'ten' is not an integer",
    ),
    "learning rate NaN": lambda b, s: (
        *_train(b, s, "--learning-rate", "nan"),
        "learning_rate nan is not allowed; allowed: a number from 1e-09 to 10",
    ),
    "learning rate infinite": lambda b, s: (
        *_train(b, s, "--learning-rate", "inf"),
        "learning_rate inf is not allowed",
    ),
    "learning rate zero": lambda b, s: (*_train(b, s, "--learning-rate", "0"), "learning_rate 0.0 is not allowed"),
    "steps per execution zero": lambda b, s: (
        *_train(b, s, "--steps-per-execution", "0"),
        "steps_per_execution 0 is not allowed",
    ),
    "shuffle buffer zero": lambda b, s: (
        *_train(b, s, "--shuffle-buffer", "0"),
        "shuffle_buffer 0 is not allowed; allowed: an integer of at least 1",
    ),
    "start-up timeout negative": lambda b, s: (
        *_train(b, s, "--startup-timeout", "-5"),
        "startup_timeout -5.0 is not allowed; allowed: a number from 1 to 86400",
    ),
    "collective timeout NaN": lambda b, s: (
        *_train(b, s, "--collective-timeout", "nan"),
        "collective_timeout nan is not allowed",
    ),
    "max restarts negative": lambda b, s: (
        *_train(b, s, "--max-restarts", "-1"),
        "max_restarts -1 is not allowed; allowed: an integer from 0 to 100",
    ),
    "strategy unknown": lambda b, s: (
        *_train(b, s, "--strategy", "ring"),
        "strategy 'ring' is not allowed; allowed: multi_worker_mirrored, parameter_server",
    ),
    "checkpoints on S3": lambda b, s: (
        *_train(b, s, "--checkpoint-dir", "s3://models/ckpt"),
        "checkpoint_dir 's3://models/ckpt' is not allowed; allowed: empty, a local or volume path (TensorFlow",
    ),
    "status location with an unknown scheme": lambda b, s: (
        *_train(b, s, "--status-uri", "hdfs://nn/status.json"),
        "status_uri 'hdfs://nn/status.json' is not allowed; allowed: empty, a path, s3://BUCKET/KEY",
    ),
    # trainer-train: the cluster
    "TF_CONFIG bad JSON": lambda b, s: (*_train(b, s, "--tf-config", "{'cluster': 1"), "TF_CONFIG is not valid JSON"),
    "TF_CONFIG index out of range": lambda b, s: (
        *_train(b, s, "--tf-config", _tf({"worker": ["a:1", "b:1"]}, index=2)),
        "task index 2 is out of range for 'worker'; allowed: 0 to 1",
    ),
    "gate on a metric the model does not report": lambda b, s: (
        *_train(b, s, "--gate", "auc>=0.9", "--epochs", "1"),
        "gate 'auc >= 0.9' names metric 'auc', which the built-in CNN does not report; allowed: a metric it reports",
    ),
    "parameter-server task started on its own without a run id": lambda b, s: (
        *_train(
            b,
            s,
            "--strategy",
            "parameter_server",
            "--tf-config",
            _tf({"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"]}, "ps"),
        ),
        "run_id is empty for a task of a parameter-server cluster started on its own; allowed: the same --run-id",
    ),
    "TF_CONFIG duplicate hosts": lambda b, s: (
        *_train(b, s, "--tf-config", _tf({"worker": ["a:1", "a:1"]})),
        "address 'a:1' appears twice",
    ),
    "TF_CONFIG missing task": lambda b, s: (
        *_train(b, s, "--tf-config", json.dumps({"cluster": {"worker": ["a:1"]}})),
        "TF_CONFIG needs 'cluster' and 'task' keys",
    ),
    "port above 65535": lambda b, s: (
        *_train(b, s, "--cluster-spec", '{"worker": ["a:70000"]}', "--worker-index", "0"),
        "address 'a:70000' has port '70000'; allowed: an integer from 1 to 65535",
    ),
    "port zero": lambda b, s: (*_train(b, s, "--tf-config", _tf({"worker": ["a:0"]})), "has port '0'"),
    "cluster spec without an index": lambda b, s: (
        *_train(b, s, "--cluster-spec", '{"worker": ["a:1"]}'),
        "--cluster-spec needs --worker-index",
    ),
    # trainer-train: the dataset and the output
    "TFRecord shard corrupted": lambda b, s: (
        *_train(b, str(b / "corrupted")),
        "train-00002-of-00004.tfrecord' is corrupted",
    ),
    "metadata missing": lambda b, s: (*_train(b, str(b / "no-metadata")), "has no metadata.json"),
    "metadata image shape with no channel": lambda b, s: (
        *_train(b, str(b / "zero-channels")),
        "image_shape [28, 28, 0] is not allowed",
    ),
    "metadata class names short": lambda b, s: (
        *_train(b, str(b / "names-short")),
        "class_names ['0', '1'] is not allowed; allowed: 10 distinct",
    ),
    "metadata example count negative": lambda b, s: (
        *_train(b, str(b / "count-negative")),
        "splits.train.num_examples -4000 is not allowed",
    ),
    "metadata shard outside the dataset": lambda b, s: (*_train(b, str(b / "shard-path")), "splits.train.shards"),
    "metadata one class": lambda b, s: (
        *_train(b, str(b / "one-class")),
        "num_classes 1 is not allowed; allowed: an integer from 2",
    ),
    "unwritable model directory": lambda b, s: (
        train.main,
        ["--data", s, "--model-dir", str(b / "a-file" / "model")],
        None,
        "is not writable",
    ),
    "unwritable TensorBoard directory": lambda b, s: (
        *_train(b, s, "--tensorboard-dir", str(b / "a-file" / "tb"), "--run-id", "night-1"),
        "output location " + repr(str(b / "a-file" / "tb" / "night-1" / "train")) + " is not writable",
    ),
    # trainer-prepare
    "unknown TFDS name": lambda b, s: (
        *_prepare(b, "tfds:no_such_set_xyz"),
        "TFDS dataset 'no_such_set_xyz' does not exist",
    ),
    "unrecognised source": lambda b, s: (
        *_prepare(b, "ftp://x"),
        "source 'ftp://x' is not allowed; allowed: 'sample', 'idx:DIR_OR_URI'",
    ),
    "IDX directory missing a file": lambda b, s: (
        *_prepare(b, f"idx:{b / 'idx-missing'}"),
        "has no t10k-labels-idx1-ubyte.gz",
    ),
    "IDX directory missing": lambda b, s: (*_prepare(b, f"idx:{b / 'nowhere'}"), "does not exist"),
    "class names with an empty one": lambda b, s: (
        *_prepare(b, "sample", "--class-names", "zero,,two"),
        "class_names 'zero,,two' is not allowed; allowed: empty, or comma-separated class names, none empty and no two",
    ),
    "class names with a duplicate": lambda b, s: (
        *_prepare(b, "sample", "--class-names", "a, b,a"),
        "class_names 'a, b,a' is not allowed; allowed: empty, or comma-separated class names, none empty and no two",
    ),
    "IDX file truncated": lambda b, s: (
        *_prepare(b, f"idx:{b / 'idx-truncated'}"),
        "train-labels-idx1-ubyte.gz' is not a complete gzip file",
    ),
    "IDX wrong magic number": lambda b, s: (
        *_prepare(b, f"idx:{b / 'idx-magic'}"),
        "has magic number 0x00000c03; allowed: 0x00000801 to 0x00000804",
    ),
    "shards zero": lambda b, s: (
        *_prepare(b, "sample", "--num-shards", "0"),
        "num_shards 0 is not allowed; allowed: an integer from 1 to 1024",
    ),
    "max train examples negative": lambda b, s: (
        *_prepare(b, "sample", "--max-train-examples", "-1"),
        "max_train_examples -1 is not allowed",
    ),
    "network timeout infinite": lambda b, s: (
        *_prepare(b, "sample", "--network-timeout", "inf"),
        "network_timeout inf is not allowed",
    ),
    "unwritable output location": lambda b, s: (
        prepare.main,
        ["--source", "sample", "--output", str(b / "a-file" / "out")],
        None,
        "is not writable",
    ),
    # trainer-evaluate
    "model directory without SavedModel": lambda b, s: (
        evaluate.main,
        ["--model-dir", str(b / "not-a-model"), "--data", s, "--output", str(b / "out" / "metrics.json")],
        "metrics.json",
        "holds no SavedModel",
    ),
    "evaluation data without metadata": lambda b, s: (
        evaluate.main,
        ["--model-dir", str(b / "not-a-model"), "--data", str(b / "no-metadata")],
        None,
        "holds no SavedModel",
    ),
    # trainer-launch
    "workers zero": lambda b, s: (
        launch.main,
        ["--workers", "0", "--", "--data", s],
        None,
        "workers 0 is not allowed; allowed: an integer from 1 to 16",
    ),
    "workers above maximum": lambda b, s: (
        launch.main,
        ["--workers", "17"],
        None,
        "workers 17 is not allowed; allowed: an integer from 1 to 16",
    ),
    "launcher restarts negative": lambda b, s: (
        launch.main,
        ["--workers", "2", "--max-restarts", "-1"],
        None,
        "max restarts -1 is not allowed",
    ),
    "launcher grace NaN": lambda b, s: (
        launch.main,
        ["--workers", "2", "--grace", "nan"],
        None,
        "grace nan is not allowed; allowed: 0 to 3600",
    ),
    "launcher parameter servers negative": lambda b, s: (
        launch.main,
        ["--workers", "2", "--ps", "-1"],
        None,
        "ps -1 is not allowed",
    ),
}


CASES.update(PIPELINE_CASES)


def test_the_table_covers_every_entry_point():
    assert len(CASES) >= 40


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line_exit_2_and_no_artifact(case, bad, sample_data, capsys):
    entry, argv, output, message = CASES[case](bad, sample_data)
    (bad / "out").mkdir(exist_ok=True)
    before = set(os.listdir(bad / "out"))
    code = entry(argv)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], err[-2000:]
    assert "Traceback" not in err
    if output:
        assert not (bad / "out" / output).exists()
    assert set(os.listdir(bad / "out")) <= before, "nothing new at the output location"
