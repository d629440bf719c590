"""A dataset from your own function (`source` 'fn:package.module:function'), saved with `tf.data.Dataset.save`.

The function is called once per split, `function("train")` and `function("test")`, when the data is prepared; it
returns a finite `tf.data.Dataset` of unbatched `(features, label)` pairs (features a tensor or a dict of tensors).
Each split is written with `tf.data.Dataset.save` beside `metadata.json`, so every worker and the evaluation read the
same examples whatever the function does on another day, and nothing but TensorFlow is needed to read them.
"""

from __future__ import annotations

import logging
from typing import Any

from trainer.config.contract import DataConfig
from trainer.core.errors import UsageError
from trainer.core.functions import call, load

log = logging.getLogger(__name__)

FORMAT = "tf.data"
SPLITS = ("train", "test")


def split_dataset(spec: str, function: Any, split: str) -> Any:
    """`function(split)`, checked: a finite tf.data.Dataset of `(features, label)` pairs.

    Raises:
        UsageError: naming the source and what it returned instead.
    """
    import tensorflow as tf

    setting = f"source 'fn:{spec}'"
    dataset = call(function, setting, split)
    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(
            f"{setting} returned {type(dataset).__name__} for split {split!r}; allowed: a tf.data.Dataset of "
            "unbatched (features, label) pairs"
        )
    element = dataset.element_spec
    if not isinstance(element, tuple) or len(element) != 2:
        raise UsageError(
            f"{setting} returned a dataset of {element} for split {split!r}; allowed: (features, label) pairs"
        )
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise UsageError(f"{setting} returned an endless dataset for split {split!r}; allowed: a finite one")
    return dataset


def prepare_function(spec: str, config: DataConfig, out: str) -> dict[str, Any]:
    """Saves both splits of `function(split)` into `out` (at most max_*_examples each); returns the metadata."""
    import tensorflow as tf

    from trainer import __version__

    function = load(spec, f"source 'fn:{spec}'")
    limits = {"train": config.max_train_examples, "test": config.max_test_examples}
    splits: dict[str, Any] = {}
    specs = {}
    for split in SPLITS:
        dataset = split_dataset(spec, function, split)
        if limits[split]:
            dataset = dataset.take(limits[split])
        # One shard, read back in order (`load_split`): by default save spreads elements over as many shards as
        # this machine has CPUs and load interleaves them by the reading machine's CPUs, so each worker's every-Nth
        # share would depend on the nodes the pods landed on.
        dataset.save(f"{out}/{split}", shard_func=_one_shard)
        count = int(tf.data.Dataset.load(f"{out}/{split}", reader_func=_in_order).cardinality())
        if count < 1:
            raise UsageError(f"source 'fn:{spec}' returned no examples for split {split!r}; allowed: at least 1")
        splits[split] = {"num_examples": count, "directory": split}
        specs[split] = dataset.element_spec
    if specs["train"] != specs["test"]:
        raise UsageError(
            f"source 'fn:{spec}' returned train examples of {specs['train']} but test examples of {specs['test']}; "
            "allowed: the same features and label for both"
        )
    return {
        "format": FORMAT,
        "source": f"fn:{spec}",
        "element_spec": str(specs["train"]),
        "splits": splits,
        "created_by": f"trainer {__version__}",
    }


def _one_shard(*_: Any) -> Any:
    import tensorflow as tf

    return tf.constant(0, tf.int64)


def _in_order(shards: Any) -> Any:
    return shards.flat_map(lambda shard: shard)


def check_metadata(meta: dict[str, Any], path: str) -> dict[str, Any]:
    """Checks metadata.json of a dataset saved from a function.

    Raises:
        UsageError: naming the first field that is missing or out of range, and what is allowed.
    """
    splits = meta.get("splits")
    if not isinstance(splits, dict) or set(SPLITS) - set(splits):
        raise UsageError(f"dataset metadata {path!r}: splits {splits!r} is not allowed; allowed: train and test")
    for split, info in splits.items():
        directory = info.get("directory") if isinstance(info, dict) else None
        count = info.get("num_examples") if isinstance(info, dict) else None
        if not isinstance(directory, str) or not directory or "/" in directory:
            raise UsageError(f"dataset metadata {path!r}: splits.{split}.directory {directory!r} is not a plain name")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise UsageError(f"dataset metadata {path!r}: splits.{split}.num_examples {count!r}; allowed: at least 1")
    return meta


def is_saved(meta: dict[str, Any]) -> bool:
    """Whether a prepared dataset was saved from a function (else: TFRecord shards of images)."""
    return meta.get("format") == FORMAT


def load_split(data_dir: str, meta: dict[str, Any], split: str) -> Any:
    """A saved split as the function returned it: unbatched `(features, label)` pairs.

    Raises:
        UsageError: the split is not in the dataset or its files are missing.
    """
    import tensorflow as tf

    from trainer.core.files import exists

    if split not in meta["splits"]:
        raise UsageError(f"dataset {data_dir!r} has no split {split!r}; it has {', '.join(meta['splits'])}")
    path = f"{data_dir.rstrip('/')}/{meta['splits'][split]['directory']}"
    if not exists(f"{path}/dataset_spec.pb"):
        raise UsageError(f"dataset split {path!r} is missing (no dataset_spec.pb written by tf.data.Dataset.save)")
    return tf.data.Dataset.load(path, reader_func=_in_order)
