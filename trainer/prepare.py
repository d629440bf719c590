"""Data preparation: a TFDS dataset, a directory of MNIST-format IDX files, or the shipped sample -> TFRecords.

    trainer-prepare --source sample --output /tmp/mnist
    trainer-prepare --source idx:/usr/share/datasets/fashion-mnist --output /tmp/fashion
    trainer-prepare --source tfds:mnist --tfds-data-dir ~/tensorflow_datasets --output /tmp/mnist-full
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from trainer.atomic import atomic_directory, check_writable_parent
from trainer.cli import run_cli
from trainer.errors import UsageError
from trainer.idx import read_split
from trainer.records import METADATA_FILE, make_metadata, write_split

log = logging.getLogger(__name__)

SOURCE_FORMS = "'sample', 'idx:DIR_OR_URI', or a TFDS name such as 'mnist' or 'tfds:fashion_mnist'"
_TFDS_NAME = re.compile(r"^[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9.*]+)?$")


def sample_dir() -> str:
    """Where the shipped MNIST sample lives: `$TRAINER_SAMPLE_DIR`, else `data/mnist-sample` in this checkout."""
    return os.environ.get("TRAINER_SAMPLE_DIR") or str(Path(__file__).resolve().parents[1] / "data" / "mnist-sample")


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    source: str = "tfds:mnist"
    output: str = ""
    tfds_data_dir: str | None = None
    num_shards: int = 4
    max_train: int | None = None
    max_test: int | None = None
    class_names: tuple[str, ...] | None = None
    network_timeout: float = 5.0

    def __post_init__(self) -> None:
        if not self.output:
            raise UsageError("output path is empty; pass --output DIR")
        if self.num_shards < 1:
            raise UsageError(f"num_shards {self.num_shards} must be at least 1")
        for name in ("max_train", "max_test"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"{name} {value} must be a positive number of examples")
        parse_source(self.source)


def parse_source(source: str) -> tuple[str, str]:
    """Splits a source string into (kind, location): ('idx', dir), ('tfds', name).

    Raises:
        UsageError: naming the source when it is none of the allowed forms.
    """
    if source == "sample":
        return "idx", sample_dir()
    if source.startswith("idx:") and len(source) > 4:
        return "idx", source[4:]
    name = source[5:] if source.startswith("tfds:") else source
    if _TFDS_NAME.match(name):
        return "tfds", name
    raise UsageError(f"data source {source!r} is not recognised; allowed: {SOURCE_FORMS}")


def _limit(n: int, limit: int | None) -> int:
    return n if limit is None else min(n, limit)


def _idx_examples(images: np.ndarray, labels: np.ndarray, limit: int | None) -> Iterator[tuple[np.ndarray, int]]:
    for i in range(_limit(len(images), limit)):
        yield images[i], int(labels[i])


def prepare_idx(directory: str, config: PrepareConfig, out: str) -> dict[str, Any]:
    train_images, train_labels = read_split(directory, "train")
    test_images, test_labels = read_split(directory, "test")
    if train_images.shape[1:] != test_images.shape[1:]:
        raise UsageError(f"IDX directory {directory!r} has train images {train_images.shape[1:]} but test images {test_images.shape[1:]}")
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    names = list(config.class_names) if config.class_names else [str(i) for i in range(num_classes)]
    if len(names) < num_classes:
        raise UsageError(f"{len(names)} class names given but labels go up to {num_classes - 1}; give {num_classes}")
    shape = (*train_images.shape[1:], 1)
    splits = {
        "train": write_split(out, "train", _idx_examples(train_images, train_labels, config.max_train), config.num_shards, shape),
        "test": write_split(out, "test", _idx_examples(test_images, test_labels, config.max_test), 1, shape),
    }
    return make_metadata(config.source, shape, names, splits)


def _check_download_hosts(builder: Any, name: str, timeout: float) -> None:
    """Fails within `timeout` seconds per host when the dataset's download hosts cannot be reached."""
    hosts = sorted({urlparse(url).hostname for url in (builder.url_infos or {}) if urlparse(url).hostname})
    for host in hosts:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
        except OSError as err:
            raise UsageError(
                f"TFDS dataset {name!r} is not prepared in {builder.data_dir!r} and its download host {host} "
                f"cannot be reached ({err.strerror or err}); pass --source sample (the shipped MNIST digits), "
                "--source idx:DIR (MNIST-format IDX files) or --tfds-data-dir DIR holding a prepared copy"
            ) from None


def prepare_tfds(name: str, config: PrepareConfig, out: str) -> dict[str, Any]:
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=config.tfds_data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(f"TFDS dataset {name!r} does not exist; allowed: a name from tfds.list_builders(), e.g. mnist, fashion_mnist") from None
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise UsageError(f"TFDS dataset {name!r} has features {list(features)}; allowed: image-classification datasets with 'image' and 'label'")
    shape = tuple(features["image"].shape)
    if len(shape) != 3 or None in shape:
        raise UsageError(f"TFDS dataset {name!r} has images of shape {shape}; allowed: a fixed height x width x channels")
    if not builder.is_prepared():
        _check_download_hosts(builder, name, config.network_timeout)
        builder.download_and_prepare()
    available = set(builder.info.splits)
    for split in ("train", "test"):
        if split not in available:
            raise UsageError(f"TFDS dataset {name!r} has no {split!r} split; it has {', '.join(sorted(available))}")
    limits = {"train": config.max_train, "test": config.max_test}
    splits = {}
    for split, shards in (("train", config.num_shards), ("test", 1)):
        tfds_split = split if limits[split] is None else f"{split}[:{limits[split]}]"
        ds = builder.as_dataset(split=tfds_split)
        examples = ((ex["image"], int(ex["label"])) for ex in tfds.as_numpy(ds))
        splits[split] = write_split(out, split, examples, shards, shape)
    return make_metadata(config.source, shape, list(features["label"].names), splits)


def run(config: PrepareConfig) -> dict[str, Any]:
    """Prepares the dataset into `config.output` atomically and returns its metadata."""
    from trainer.atomic import write_json

    kind, location = parse_source(config.source)
    check_writable_parent(config.output)
    with atomic_directory(config.output) as out:
        meta = prepare_idx(location, config, out) if kind == "idx" else prepare_tfds(location, config, out)
        write_json(f"{out}/{METADATA_FILE}", meta)
    counts = ", ".join(f"{split} {s['num_examples']}" for split, s in meta["splits"].items())
    log.info("prepared %s into %s: %s examples, image shape %s, %d classes", config.source, config.output, counts, meta["image_shape"], meta["num_classes"])
    return meta


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainer-prepare", description="Prepare an image-classification dataset as TFRecord shards + metadata.json.")
    parser.add_argument("--source", default="tfds:mnist", help=f"where the data comes from: {SOURCE_FORMS} (default: tfds:mnist)")
    parser.add_argument("--output", required=True, help="output directory (local path or tf.io.gfile URI); replaced atomically")
    parser.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir holding (or to receive) prepared TFDS datasets")
    parser.add_argument("--num-shards", type=int, default=4, help="TFRecord shards for the train split (default 4)")
    parser.add_argument("--max-train", type=int, default=None, help="keep only the first N train examples")
    parser.add_argument("--max-test", type=int, default=None, help="keep only the first N test examples")
    parser.add_argument("--class-names", default=None, help="comma-separated class names for IDX data (default: 0, 1, ...)")
    parser.add_argument("--network-timeout", type=float, default=5.0, help="seconds to wait for a TFDS download host before failing")
    return parser


def config_from_args(args: argparse.Namespace) -> PrepareConfig:
    return PrepareConfig(
        source=args.source,
        output=args.output,
        tfds_data_dir=args.tfds_data_dir,
        num_shards=args.num_shards,
        max_train=args.max_train,
        max_test=args.max_test,
        class_names=tuple(n.strip() for n in args.class_names.split(",")) if args.class_names else None,
        network_timeout=args.network_timeout,
    )


def main(argv: list[str] | None = None) -> int:
    return run_cli(lambda: run(config_from_args(build_parser().parse_args(argv))))


if __name__ == "__main__":
    sys.exit(main())
