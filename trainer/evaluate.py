"""Evaluation of an exported SavedModel (not the Python model code) on the held-out split.

trainer-evaluate --model-dir /tmp/model --data /tmp/mnist --output /tmp/metrics.json
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.cli import run_cli
from trainer.config.flags import Parser
from trainer.evaluation import metrics as metrics_lib

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-evaluate."""
    p = Parser(
        prog="trainer-evaluate", description="Evaluate an exported SavedModel on a prepared dataset's held-out split."
    )
    p.add_argument("--model-dir", required=True, help="directory the trainer wrote (or a SavedModel directory)")
    p.add_argument("--data", required=True, help="prepared dataset directory")
    p.add_argument("--output", default=None, help="metrics JSON path (written atomically)")
    p.add_argument("--split", default="test", help="the split to evaluate (default: test)")
    return p


def main(argv: list[str] | None = None) -> int:
    """trainer-evaluate: evaluates a SavedModel; returns the exit code."""

    def body() -> None:
        args = build_parser().parse_args(argv)
        metrics = metrics_lib.run(args.model_dir, args.data, args.output, args.split)
        print(f"accuracy {metrics['accuracy']:.4f}")

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
