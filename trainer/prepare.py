"""Data preparation: a TFDS dataset, a directory of MNIST-format IDX files, or the shipped sample -> TFRecords.

trainer-prepare --source sample --output /tmp/mnist
trainer-prepare --source idx:/usr/share/datasets/fashion-mnist --output /tmp/fashion
trainer-prepare --source tfds:mnist --tfds-data-dir ~/tensorflow_datasets --output /tmp/mnist-full
trainer-prepare --source idx:DIR --output /tmp/fashion --data-uri s3://datasets/fashion --s3-endpoint http://minio:9000

The shards are written by as many processes as the CPU allows (`--workers N` at most; `trainer.data.writers`), the
same bytes whatever their number. With `--data-uri` they go straight to that bucket prefix or path, and `--output`
holds only metadata.json, which names it.
"""

from __future__ import annotations

import argparse
import logging
import sys

from trainer.config.contract import DataConfig, StorageConfig
from trainer.config.flags import Parser, add_settings, settings_from
from trainer.core.entry import run_cli
from trainer.data import sources
from trainer.storage import kfpstore

log = logging.getLogger(__name__)


SETTINGS = (
    "source",
    "num_shards",
    "prepare_workers",
    "max_train_examples",
    "max_test_examples",
    "class_names",
    "tfds_data_dir",
    "network_timeout",
    "data_uri",
    "s3_endpoint",
)


def build_parser() -> argparse.ArgumentParser:
    """The command line of trainer-prepare (the data settings of the contract)."""
    parser = Parser(
        prog="trainer-prepare",
        description="Prepare a dataset (images as TFRecord shards, or your function's splits saved by tf.data).",
    )
    parser.add_argument(
        "--output", required=True, help="output directory (local path or tf.io.gfile URI); replaced atomically"
    )
    add_settings(parser, SETTINGS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """trainer-prepare: prepares a dataset; returns the exit code."""

    def body() -> None:
        args = build_parser().parse_args(argv)
        data = settings_from(args, DataConfig)
        endpoint = kfpstore.store(settings_from(args, StorageConfig), None).endpoint if data.data_uri else ""
        sources.run(data, args.output, endpoint)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
