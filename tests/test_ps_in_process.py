"""The parameter-server runner's coordinator loop in this process, on an in-process cluster of 2 workers and 1 ps.

TensorFlow's own pattern for ParameterServerStrategy tests: standard servers started in the test process, the
coordinator (`trainer.training.parameter_server.run`, the chief) in the same process, its strategy built from the
chief's TF_CONFIG as a chief's is. The processes' side (the servers' exits on the chief's status, a lost worker, a
lost ps, a lost chief) is tests/test_parameter_server.py's and tests/test_ps_status.py's.
"""

import json
import logging

import pytest

from tests.support.ps_cluster import in_process_cluster
from trainer.config.contract import ClusterConfig, DataConfig, OptimConfig, RuntimeConfig, TrainConfig
from trainer.core.runs import run_key
from trainer.data import sources
from trainer.evaluation.metrics import evaluate
from trainer.records.history import History
from trainer.training import parameter_server as ps


@pytest.fixture(scope="module")
def few_digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("few") / "data")
    sources.run(DataConfig(source="sample", max_train_examples=96, max_test_examples=48, num_shards=2), out)
    return out


def test_the_chief_coordinates_training_on_in_process_servers_and_exports_the_model(few_digits, tmp_path, caplog):
    cluster = in_process_cluster(num_workers=2, num_ps=1)
    tf_config = {"cluster": cluster, "task": {"type": "chief", "index": 0}}
    model_dir = tmp_path / "model"
    config = TrainConfig(
        RuntimeConfig(data_dir=few_digits, model_dir=str(model_dir), run_id="ps-in-process"),
        cluster=ClusterConfig(strategy="parameter_server", cluster_mode="local"),
        data=DataConfig(shuffle_buffer=96),
        optim=OptimConfig(batch_size=16, epochs=3, steps_per_epoch=4, learning_rate=0.003),
    )
    with caplog.at_level(logging.INFO):
        history = ps.run(config, tf_config)
    assert (history.strategy, history.workers, history.parameter_servers) == ("parameter_server", 2, 1)
    assert [e["epoch"] for e in history.epochs] == [1, 2, 3] and history.steps_per_epoch == 4
    assert History.read(str(model_dir)) == history
    assert sorted(p.name for p in model_dir.iterdir()) == ["history.json", "model.keras", "saved_model"]
    said = [r.getMessage() for r in caplog.records]
    assert "chief: 3 epochs x 4 steps of 16 examples over 2 workers and 1 parameter servers" in said
    status = json.loads((tmp_path / "model.status" / f"{run_key('ps-in-process')}.json").read_text())
    assert status["state"] == "succeeded", "the servers would exit 0 on it"
    assert not (tmp_path / "model.backup").exists(), "the checkpoints are removed after a successful run"
    assert evaluate(str(model_dir), few_digits).num_examples == 48, "the export serves the test split"
