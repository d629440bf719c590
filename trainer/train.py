"""`trainer-train`: train the CNN (or your model_fn) on a prepared dataset, alone or as one task of a TF_CONFIG cluster.

    TF_CONFIG='{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}' \\
        trainer-train --data /tmp/mnist --model-dir /tmp/model

With no TF_CONFIG the same code trains in this process. As a member of a cluster it trains in a child process
under `trainer.cluster.supervisor` (start-up watchdog, prompt cancel, `--max-restarts` restarts in place). The flags are
the contract's settings (`trainer.config.contract`); this is the only place that reads TF_CONFIG from the environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from trainer.cluster import control, topology
from trainer.config.contract import (
    ClusterConfig,
    DataConfig,
    ModelConfig,
    OptimConfig,
    PublishConfig,
    RuntimeConfig,
    TrainConfig,
)
from trainer.config.flags import Parser, add_settings, settings_from
from trainer.core.entry import run_cli
from trainer.core.errors import UsageError
from trainer.core.runs import new_run_id

log = logging.getLogger(__name__)

SETTINGS = {
    "data and model": (
        "data_dir",
        "model_fn",
        "model_dir",
        "checkpoint_dir",
        "run_id",
        "tensorboard_dir",
        "shuffle_buffer",
        "seed",
    ),
    "optimisation": (
        "epochs",
        "batch_size",
        "learning_rate",
        "steps_per_epoch",
        "steps_per_execution",
        "validate",
        "mixed_precision",
    ),
    "quality gate (checked against the model's metrics before the first epoch)": ("gate",),
    "cluster and timeouts": (
        "strategy",
        "cluster_mode",
        "startup_timeout",
        "collective_timeout",
        "max_restarts",
        "status_uri",
        "chief_timeout",
        "pack_bytes",
        "sync_batch_metrics",
        "threads",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-train: the contract's training settings and the cluster wiring."""
    parser = Parser(
        prog="trainer-train",
        description="Train the CNN (or --model-fn) on a prepared dataset, alone or as one task of a TF_CONFIG cluster.",
    )
    for title, names in SETTINGS.items():
        add_settings(parser.add_argument_group(title), names)
    wiring = parser.add_argument_group("cluster membership (default: the TF_CONFIG environment variable)")
    wiring.add_argument("--tf-config", default=None, help="TF_CONFIG JSON")
    wiring.add_argument(
        "--cluster-spec",
        default=None,
        help='instead of --tf-config: cluster JSON such as {"worker": ["h0:2222", "h1:2222"]}',
    )
    wiring.add_argument("--worker-index", type=int, default=None, help="with --cluster-spec: this worker's index")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The training config the parsed flags describe."""
    return TrainConfig(
        runtime=settings_from(args, RuntimeConfig),
        data=settings_from(args, DataConfig),
        model=settings_from(args, ModelConfig),
        optim=settings_from(args, OptimConfig),
        cluster=settings_from(args, ClusterConfig),
        publish=settings_from(args, PublishConfig),
    )


def tf_config_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The TF_CONFIG these arguments (or, failing them, the environment) describe, checked; None for one process."""
    if args.cluster_spec is not None:
        if args.worker_index is None:
            raise UsageError("--cluster-spec needs --worker-index")
        return topology.build_tf_config(_json("cluster spec", args.cluster_spec), "worker", args.worker_index)
    text = args.tf_config if args.tf_config is not None else os.environ.get("TF_CONFIG", "")
    return topology.parse_tf_config(text) if text.strip() else None


def _json(what: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{what} is not valid JSON ({err.msg}): {text[:80]!r}") from None


def run(config: TrainConfig, tf_config: dict[str, Any] | None, control_text: str = "") -> int:
    """Trains in this process (one process) or under a supervisor (a cluster member); returns the exit code.

    `control_text` is `TRAINER_CONTROL`; the supervisors' control addresses matter only to tasks that restart
    together (`trainer.cluster.lifecycle.restarts_together`, `trainer.cluster.control.addresses`).
    """
    from trainer.cluster.resume import checkpoint_root, clean_before_training
    from trainer.training.task import check_topology, run_task

    check_topology(config, tf_config)
    separate = bool(tf_config) and len(topology.task_order(tf_config["cluster"])) > 1
    if not config.runtime.run_id:
        if separate and config.cluster.strategy == "parameter_server":
            raise UsageError(
                "run_id is empty for a task of a parameter-server cluster started on its own; allowed: the same "
                "--run-id for every task of the run (trainer-launch and the pipelines set it), so that all read "
                "the chief's status from the run's own location"
            )
        config = config.replace(run_id=new_run_id())
        log.info(
            "run id %s (generated%s: pass --run-id %s to resume this run's checkpoints in a later process)",
            config.runtime.run_id,
            ", this task's own: give every task of a cluster started by hand the same --run-id" if separate else "",
            config.runtime.run_id,
        )
    if not tf_config or len(topology.task_order(tf_config["cluster"])) == 1:
        clean_before_training(checkpoint_root(config), config.runtime.run_id, tf_config)
        return run_task(config, tf_config)
    from trainer.cluster import lifecycle

    together = lifecycle.restarts_together(tf_config, config.cluster.max_restarts)
    member = lifecycle.Member.of_tf_config(tf_config, control.addresses(tf_config, control_text) if together else {})
    return lifecycle.supervise(member, lifecycle.Trainer(config))


def main(argv: list[str] | None = None) -> int:
    """trainer-train: trains alone or as one task of a cluster; returns the exit code."""

    def body() -> int:
        args = build_parser().parse_args(argv)
        config = config_from_args(args)
        return run(config, tf_config_from_args(args), os.environ.get(control.ADDRESSES_ENV, ""))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
