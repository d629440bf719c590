"""One collective per training step: tf-keras' per-step metric all-reduces removed, the epoch's metrics unchanged."""

import json
import subprocess
import sys

import pytest

from tests.support.paths import ROOT
from trainer.cluster.local_processes import free_ports


def _two_workers(modes, tmp_path):
    """Two probe workers training once per mode of MODES (one strategy, one process each): [{mode: report}] by rank."""
    ports = ",".join(map(str, free_ports(2)))
    outs = [tmp_path / f"worker-{rank}.json" for rank in (0, 1)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.collective_probe", str(rank), ports, modes, str(outs[rank])],
            cwd=ROOT,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_a_training_step_all_reduces_only_the_gradients_and_epoch_metrics_stay_global(tmp_path):
    workers = _two_workers("keras,local", tmp_path)
    keras_default, local = [w["keras"] for w in workers], [w["local"] for w in workers]
    # tf-keras: the gradients, then for the loss and the accuracy total and count, then each returned value.
    assert [w["collectives"] for w in keras_default] == [7, 7]
    assert [w["collectives"] for w in local] == [1, 1]
    # Per-batch logs are each worker's own (they saw different data) ...
    assert local[0]["batches"][-1]["accuracy"] != local[1]["batches"][-1]["accuracy"]
    assert keras_default[0]["batches"][-1] == keras_default[1]["batches"][-1]
    # ... while the epoch's metrics are aggregated over both workers, as they were.
    assert local[0]["epoch"] == local[1]["epoch"]
    assert local[0]["epoch"] == pytest.approx(keras_default[0]["epoch"], rel=1e-5)
