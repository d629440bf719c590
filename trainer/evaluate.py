"""Evaluation of a trained model on the held-out split.

The built-in CNN's exported SavedModel (not the Python model code) gets accuracy, loss and per-class results; a
model_fn's model, the metrics it was compiled with.

trainer-evaluate --model-dir /tmp/model --data /tmp/mnist --output /tmp/metrics.json
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.cli import run_cli
from trainer.config.flags import Parser
from trainer.core.errors import UsageError
from trainer.evaluation import metrics as metrics_lib
from trainer.evaluation import model_metrics
from trainer.training.history import History

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-evaluate."""
    p = Parser(prog="trainer-evaluate", description="Evaluate a trained model on a prepared dataset's held-out split.")
    p.add_argument("--model-dir", required=True, help="directory the trainer wrote (or a SavedModel directory)")
    p.add_argument("--data", required=True, help="prepared dataset directory")
    p.add_argument("--output", default=None, help="metrics JSON path (written atomically)")
    p.add_argument("--split", default="test", help="the split to evaluate (default: test)")
    return p


def _model_fn(model_dir: str) -> str:
    """The model_fn that trained the model in `model_dir`; empty for the CNN or a bare SavedModel directory."""
    try:
        return History.read(model_dir).model_fn
    except UsageError:
        return ""


def main(argv: list[str] | None = None) -> int:
    """trainer-evaluate: evaluates a SavedModel; returns the exit code."""

    def body() -> None:
        args = build_parser().parse_args(argv)
        if _model_fn(args.model_dir):
            results = model_metrics.run(args.model_dir, args.data, args.output, args.split)
        else:
            results = metrics_lib.run(args.model_dir, args.data, args.output, args.split)
        print(", ".join(f"{name} {value:.4f}" for name, value in results.scalars().items()))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
