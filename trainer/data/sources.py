"""Data sources into a prepared dataset: TFDS, IDX files or the sample -> TFRecords; your function -> tf.data's save.

Every source is read as a stream, in order, and never held whole; `trainer.data.writers` writes its shards with as
many processes as the CPU allows. Your own function's splits are saved by `trainer.data.user_source`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from trainer.config.contract import SOURCE_FORMS, DataConfig, is_source
from trainer.core.errors import UsageError
from trainer.core.files import atomic_directory, check_writable_parent
from trainer.data.idx import IdxSplit
from trainer.data.place import Place
from trainer.data.tfrecords import chunked
from trainer.data.user_source import prepare_function
from trainer.data.writers import SplitSource, write_splits
from trainer.records.dataset import DatasetMetadata

log = logging.getLogger(__name__)


def sample_dir() -> str:
    """Where the shipped MNIST sample lives: `$TRAINER_SAMPLE_DIR`, else `data/mnist-sample` in this checkout."""
    return os.environ.get("TRAINER_SAMPLE_DIR") or str(Path(__file__).resolve().parents[2] / "data" / "mnist-sample")


def parse_source(source: str) -> tuple[str, str]:
    """Splits a source string into (kind, location): ('idx', dir), ('tfds', name), ('fn', 'package.module:function').

    Raises:
        UsageError: naming the source when it is none of the allowed forms.
    """
    if not is_source(source):
        raise UsageError(f"data source {source!r} is not recognised; allowed: {SOURCE_FORMS}")
    if source == "sample":
        return "idx", sample_dir()
    if source.startswith("idx:"):
        return "idx", source[4:]
    if source.startswith("fn:"):
        return "fn", source[3:]
    return "tfds", source[5:] if source.startswith("tfds:") else source


def _limit(n: int, limit: int) -> int:
    return min(n, limit) if limit else n


def _class_names(data: DataConfig) -> list[str]:
    return [n.strip() for n in data.class_names.split(",")] if data.class_names.strip() else []


@contextlib.contextmanager
def _filling(place: Place | None) -> Iterator[None]:
    """Empties `place` first and again when the block fails (nothing to do without one)."""
    if place is None:
        yield
        return
    place.clear()
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            place.clear()
        raise


def prepare_idx(directory: str, config: DataConfig, out: Place | str) -> DatasetMetadata:
    """Writes the shards of MNIST-format IDX files in `directory` into `out`; returns the metadata."""
    train, test = IdxSplit.open(directory, "train"), IdxSplit.open(directory, "test")
    if train.image_shape != test.image_shape:
        raise UsageError(
            f"IDX directory {directory!r} has train images {train.image_shape} but test images {test.image_shape}"
        )
    num_classes = max(train.label_max(), test.label_max()) + 1
    names = _class_names(config) or [str(i) for i in range(num_classes)]
    if len(names) < num_classes:
        raise UsageError(f"{len(names)} class names given but labels go up to {num_classes - 1}; give {num_classes}")
    shape = (*train.image_shape, 1)
    limits = {"train": config.max_train_examples, "test": config.max_test_examples}
    sources = [
        SplitSource(name, split.chunks(limits[name]), _limit(split.count, limits[name]), shards)
        for name, split, shards in (("train", train, config.num_shards), ("test", test, 1))
    ]
    return DatasetMetadata.of_images(config.source, shape, names, write_splits(out, sources, config.prepare_workers))


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


def prepare_tfds(name: str, config: DataConfig, out: Place | str) -> DatasetMetadata:
    """Writes the shards of the TFDS dataset `name` into `out`; returns the metadata."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=config.tfds_data_dir or None)
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(
            f"TFDS dataset {name!r} does not exist; allowed: a name from tfds.list_builders(), e.g. mnist, "
            "fashion_mnist"
        ) from None
    features = builder.info.features
    if "image" not in features or "label" not in features:
        raise UsageError(
            f"TFDS dataset {name!r} has features {list(features)}; allowed: image-classification datasets with "
            "'image' and 'label'"
        )
    shape = tuple(features["image"].shape)
    if len(shape) != 3 or None in shape:
        raise UsageError(
            f"TFDS dataset {name!r} has images of shape {shape}; allowed: a fixed height x width x channels"
        )
    if not builder.is_prepared():
        _check_download_hosts(builder, name, config.network_timeout)
        builder.download_and_prepare()
    available = set(builder.info.splits)
    for split in ("train", "test"):
        if split not in available:
            raise UsageError(f"TFDS dataset {name!r} has no {split!r} split; it has {', '.join(sorted(available))}")
    limits = {"train": config.max_train_examples, "test": config.max_test_examples}
    sources = []
    for split, shards in (("train", config.num_shards), ("test", 1)):
        tfds_split = f"{split}[:{limits[split]}]" if limits[split] else split
        examples = ((ex["image"], int(ex["label"])) for ex in tfds.as_numpy(builder.as_dataset(split=tfds_split)))
        count = _limit(builder.info.splits[split].num_examples, limits[split])
        sources.append(SplitSource(split, chunked(examples, shape, split), count, shards))
    splits = write_splits(out, sources, config.prepare_workers)
    return DatasetMetadata.of_images(config.source, shape, list(features["label"].names), splits)


def run(config: DataConfig, output: str, endpoint: str = "") -> DatasetMetadata:
    """Prepares the dataset `config.source` into `output` atomically and returns its metadata.

    With `config.data_uri` the shards go there (through `endpoint` on S3), straight from the writers, and `output`
    holds only metadata.json, which names the place; a copy of it is written beside the shards, last. What was at
    the place before is removed first, and what was written there is removed again when preparing fails.

    Raises:
        UsageError: a bad source or output, or `data_uri` with your own function's data (saved by tf.data inside the
            Dataset artifact).
    """
    kind, location = parse_source(config.source)
    if not output:
        raise UsageError("output path is empty; pass --output DIR")
    if kind == "fn" and config.data_uri:
        raise UsageError(
            f"data_uri {config.data_uri!r} is not allowed with source {config.source!r}: your function's splits are "
            "saved by tf.data inside the Dataset artifact; allowed: data_uri empty, or an image source"
        )
    check_writable_parent(output)
    place = Place.of(config.data_uri, endpoint) if config.data_uri else None
    with atomic_directory(output) as out, _filling(place):
        target = place or out
        if kind == "fn":
            meta = prepare_function(location, config, out)
        else:
            meta = prepare_idx(location, config, target) if kind == "idx" else prepare_tfds(location, config, target)
        if place is not None:
            meta = meta.placed(place.base, place.endpoint)
            place.location().write_json(meta.to_json(), DatasetMetadata.FILE)
        meta.write(out)
    counts = ", ".join(f"{split} {s.num_examples}" for split, s in meta.splits.items())
    if kind == "fn":
        log.info("prepared %s into %s: %s examples of %s", config.source, output, counts, meta.element_spec)
        return meta
    log.info(
        "prepared %s into %s%s: %s examples, image shape %s, %d classes",
        config.source,
        output,
        f" (its shards at {meta.location})" if meta.location else "",
        counts,
        list(meta.image_shape or ()),
        meta.num_classes,
    )
    return meta
