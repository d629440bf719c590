"""Evaluation of a trained model on the held-out split.

The model's kind (by the history.json beside it; a bare SavedModel directory is the built-in CNN's) evaluates it:
the built-in CNN's exported SavedModel (not the Python model code) gets accuracy, loss and per-class results; a
model_fn's model, the metrics it was compiled with.

trainer-evaluate --model-dir /tmp/model --data /tmp/mnist --output /tmp/metrics.json
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.config.flags import Parser
from trainer.core.entry import run_cli
from trainer.core.files import write_json
from trainer.modeling import kinds

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-evaluate."""
    p = Parser(prog="trainer-evaluate", description="Evaluate a trained model on a prepared dataset's held-out split.")
    p.add_argument("--model-dir", required=True, help="directory the trainer wrote (or a SavedModel directory)")
    p.add_argument("--data", required=True, help="prepared dataset directory")
    p.add_argument("--output", default=None, help="metrics JSON path (written atomically)")
    p.add_argument("--split", default="test", help="the split to evaluate (default: test)")
    return p


def main(argv: list[str] | None = None) -> int:
    """trainer-evaluate: evaluates a SavedModel; returns the exit code."""

    def body() -> None:
        args = build_parser().parse_args(argv)
        results, _ = kinds.of_model_dir(args.model_dir).evaluate(args.model_dir, args.data, 1, args.split)
        if args.output:
            write_json(args.output, results.to_json())
        print(", ".join(f"{name} {value:.4f}" for name, value in results.scalars().items()))

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
