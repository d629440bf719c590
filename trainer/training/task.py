"""The training process a supervisor starts: TF_CONFIG and the training config come from the environment.

    TRAINER_CONFIG='{"runtime": {...}, ...}' TF_CONFIG='{...}' python -m trainer.task

Internal: `trainer-train` and the pipeline's training steps start it through `trainer.cluster.supervisor`.
"""

from __future__ import annotations

import json
import os
import sys

from trainer.cluster.supervisor import CONFIG_ENV, RESUME_ENV, die_with_supervisor, report_formed
from trainer.cluster.topology import parse_tf_config
from trainer.config.contract import TrainConfig
from trainer.core.entry import run_cli
from trainer.training.teardown import Teardown


def check_topology(config: TrainConfig, tf_config: dict | None) -> None:
    """Refuses a cluster the strategy cannot train on, before any process starts."""
    from trainer.core.errors import UsageError
    from trainer.training import parameter_server

    if config.cluster.strategy == "parameter_server":
        parameter_server.check_topology(tf_config, config)
    elif tf_config and tf_config["cluster"].get("ps"):
        raise UsageError(
            "TF_CONFIG has 'ps' tasks but the strategy is multi_worker_mirrored; "
            "allowed: no ps tasks, or --strategy parameter_server"
        )


def run_task(
    config: TrainConfig,
    tf_config: dict | None,
    resume_epoch: int | None = None,
    teardown: Teardown | None = None,
) -> int:
    """Runs this task of the cluster with its strategy's runner; tells the supervisor once the cluster formed.

    `resume_epoch` is the epoch the supervisors agreed to resume after (None: the task's own latest checkpoint);
    `teardown` the training process's (`trainer.training.teardown`; None: a run inside another process).
    """
    from trainer.training import mirrored, parameter_server

    check_topology(config, tf_config)
    if config.cluster.strategy == "parameter_server":
        if tf_config["task"]["type"] in ("ps", "worker"):
            parameter_server.run_server(config, tf_config, on_started=report_formed)
        else:
            parameter_server.run(config, tf_config, on_formed=report_formed)
        return 0
    mirrored.run(config, tf_config, on_formed=report_formed, resume_epoch=resume_epoch, teardown=teardown)
    return 0


def main() -> int:
    """The training process's entry point; returns the exit code."""
    die_with_supervisor()
    teardown = Teardown()

    def body() -> int:
        config = TrainConfig.from_dict(json.loads(os.environ[CONFIG_ENV]))
        text = os.environ.get("TF_CONFIG", "").strip()
        resume = os.environ.get(RESUME_ENV)
        return run_task(config, parse_tf_config(text) if text else None, int(resume) if resume else None, teardown)

    return teardown.leave(run_cli(body))


if __name__ == "__main__":
    sys.exit(main())
