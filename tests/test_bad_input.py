"""Every entry point checks its input at the boundary: one line naming the value, exit code 2, nothing written."""

import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import SAMPLE_DIR
from trainer import evaluate, launch, prepare, train
from trainer.idx import encode_idx, write_gz


@pytest.fixture(scope="module")
def bad(tmp_path_factory, sample_data):
    """A directory of broken inputs, each made the way it happens in practice."""
    root = tmp_path_factory.mktemp("bad")
    missing = root / "idx-missing"
    shutil.copytree(SAMPLE_DIR, missing)
    (missing / "t10k-labels-idx1-ubyte.gz").unlink()
    truncated = root / "idx-truncated"
    shutil.copytree(SAMPLE_DIR, truncated)
    (truncated / "train-labels-idx1-ubyte.gz").write_bytes((truncated / "train-labels-idx1-ubyte.gz").read_bytes()[:200])
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
    not_a_model = root / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "history.json").write_text("{}")
    a_file = root / "a-file"
    a_file.write_text("x")
    write_gz(str(root / "unused.gz"), np.zeros(1, dtype=np.uint8))
    return root


def _train(bad, sample_data, *extra, out="model"):
    return train.main, ["--data", sample_data, "--model-dir", str(bad / "out" / out), *extra]


def _tf(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


CASES = {
    "num_workers 0": lambda b, s: (launch.main, ["--workers", "0", "--", "--data", s], "workers 0 is not allowed; allowed: 1 to 16", None),
    "num_workers negative": lambda b, s: (launch.main, ["--workers", "-3"], "workers -3 is not allowed", None),
    "num_workers above maximum": lambda b, s: (launch.main, ["--workers", "17"], "workers 17 is not allowed; allowed: 1 to 16", None),
    "max restarts negative": lambda b, s: (launch.main, ["--workers", "2", "--max-restarts", "-1"], "max restarts -1 is not allowed", None),
    "batch size zero": lambda b, s: (*_train(b, s, "--batch-size", "0"), "batch_size 0 is not allowed; allowed: an integer of at least 1", "model"),
    "batch size negative": lambda b, s: (*_train(b, s, "--batch-size", "-8"), "batch_size -8 is not allowed", "model"),
    "steps per execution zero": lambda b, s: (*_train(b, s, "--steps-per-execution", "0"),
                                              "steps_per_execution 0 is not allowed; allowed: an integer of at least 1", "model"),
    "shuffle buffer zero": lambda b, s: (*_train(b, s, "--shuffle-buffer", "0"), "shuffle_buffer 0 is not allowed; allowed: an integer of at least 1", "model"),
    "epochs zero": lambda b, s: (*_train(b, s, "--epochs", "0"), "epochs 0 is not allowed; allowed: an integer of at least 1", "model"),
    "learning rate zero": lambda b, s: (*_train(b, s, "--learning-rate", "0"), "learning_rate 0.0 is not allowed; allowed: a number above 0", "model"),
    "learning rate negative": lambda b, s: (*_train(b, s, "--learning-rate", "-0.1"), "learning_rate -0.1 is not allowed", "model"),
    "unknown TFDS name": lambda b, s: (prepare.main, ["--source", "tfds:no_such_set_xyz", "--output", str(b / "out" / "tfds")],
                                       "TFDS dataset 'no_such_set_xyz' does not exist", "tfds"),
    "unrecognised source": lambda b, s: (prepare.main, ["--source", "ftp://x", "--output", str(b / "out" / "src")],
                                         "data source 'ftp://x' is not recognised; allowed: 'sample'", "src"),
    "IDX directory missing a file": lambda b, s: (prepare.main, ["--source", f"idx:{b / 'idx-missing'}", "--output", str(b / "out" / "p1")],
                                                  "has no t10k-labels-idx1-ubyte.gz", "p1"),
    "IDX directory missing": lambda b, s: (prepare.main, ["--source", f"idx:{b / 'nowhere'}", "--output", str(b / "out" / "p0")],
                                           "does not exist", "p0"),
    "IDX file truncated": lambda b, s: (prepare.main, ["--source", f"idx:{b / 'idx-truncated'}", "--output", str(b / "out" / "p2")],
                                        "train-labels-idx1-ubyte.gz' is not a complete gzip file", "p2"),
    "IDX wrong magic number": lambda b, s: (prepare.main, ["--source", f"idx:{b / 'idx-magic'}", "--output", str(b / "out" / "p3")],
                                            "has magic number 0x00000c03; allowed: 0x00000801 to 0x00000804", "p3"),
    "TFRecord shard corrupted": lambda b, s: (train.main, ["--data", str(b / "corrupted"), "--model-dir", str(b / "out" / "m1")],
                                              "train-00002-of-00004.tfrecord' is corrupted", "m1"),
    "metadata missing": lambda b, s: (train.main, ["--data", str(b / "no-metadata"), "--model-dir", str(b / "out" / "m2")],
                                      "has no metadata.json", "m2"),
    "TF_CONFIG bad JSON": lambda b, s: (*_train(b, s, "--tf-config", "{'cluster': 1", out="m3"), "TF_CONFIG is not valid JSON", "m3"),
    "TF_CONFIG index out of range": lambda b, s: (*_train(b, s, "--tf-config", _tf({"worker": ["a:1", "b:1"]}, index=2), out="m4"),
                                                  "task index 2 is out of range for 'worker'; allowed: 0 to 1", "m4"),
    "TF_CONFIG duplicate hosts": lambda b, s: (*_train(b, s, "--tf-config", _tf({"worker": ["a:1", "a:1"]}), out="m5"),
                                               "address 'a:1' appears twice", "m5"),
    "TF_CONFIG missing task": lambda b, s: (*_train(b, s, "--tf-config", json.dumps({"cluster": {"worker": ["a:1"]}}), out="m6"),
                                            "TF_CONFIG needs 'cluster' and 'task' keys", "m6"),
    "port above 65535": lambda b, s: (*_train(b, s, "--cluster-spec", '{"worker": ["a:70000"]}', "--worker-index", "0", out="m7"),
                                      "address 'a:70000' has port '70000'; allowed: an integer from 1 to 65535", "m7"),
    "port zero": lambda b, s: (*_train(b, s, "--tf-config", _tf({"worker": ["a:0"]}), out="m8"), "has port '0'", "m8"),
    "model directory without SavedModel": lambda b, s: (evaluate.main, ["--model-dir", str(b / "not-a-model"), "--data", s,
                                                                        "--output", str(b / "out" / "metrics.json")],
                                                        "holds no SavedModel", "metrics.json"),
    "unwritable output location": lambda b, s: (prepare.main, ["--source", "sample", "--output", str(b / "a-file" / "out")],
                                                "is not writable", None),
    "unwritable model directory": lambda b, s: (train.main, ["--data", s, "--model-dir", str(b / "a-file" / "model")],
                                                "is not writable", None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line_exit_2_and_no_artifact(case, bad, sample_data, capsys):
    entry, argv, message, output = CASES[case](bad, sample_data)
    (bad / "out").mkdir(exist_ok=True)
    code = entry(argv)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], err[-2000:]
    assert "Traceback" not in err
    if output:
        assert not (bad / "out" / output).exists()
    assert not [p for p in os.listdir(bad / "out") if ".tmp-" in p]


def test_pipeline_cli_refuses_a_parameter_of_the_wrong_type(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pipelines"))
    import mnist

    with pytest.raises(SystemExit) as exit_info:
        mnist.main(["--local", "--num-workers", "two"])
    assert exit_info.value.code == 2
    assert "argument --num-workers: invalid int value: 'two'" in capsys.readouterr().err
