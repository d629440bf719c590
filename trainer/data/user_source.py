"""A dataset from your own function (`source` 'fn:package.module:function'), saved with tf.data's save format.

The function is called once per split, `function("train")` and `function("test")`, when the data is prepared; it
returns a finite `tf.data.Dataset` of unbatched `(features, label)` pairs (features a tensor or a dict of tensors).
Each split is written in `tf.data.Dataset.save`'s format beside `metadata.json`, so every worker and the evaluation
read the same examples whatever the function does on another day, and nothing but TensorFlow is needed to read them.

Every feature and the label must have one shape in every example (training batches them): a spec that leaves a
dimension open (`from_generator(..., output_signature=tf.TensorSpec([None]))`) is checked example by example while
the split is written, and a second shape is refused in one line naming the feature and both shapes. Read back, each
one has the static shape its examples share. Ragged and sparse features are refused.

Errors of your function, and of TensorFlow reading its dataset, are judged by `trainer.core.user_errors`: a transient
one (an OSError, a store unavailable) is retried with backoff, the split written again from its start.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from trainer.config.contract import DataConfig
from trainer.core.errors import UsageError
from trainer.core.functions import load
from trainer.core.user_errors import call_once, judge, retried
from trainer.records.dataset import SPLITS, DatasetMetadata, Split

log = logging.getLogger(__name__)

SHAPES_ALLOWED = (
    "one shape for every example of a feature: pad or cut sequences to one length and resize images to one size in "
    "your function, or give text as one string per example (a TextVectorization layer in the model splits it)"
)
_SHAPE_CHECK = "trainer-shape-check"
_SHAPE_FAILED = re.compile(_SHAPE_CHECK + r" (\d+) (\d+) \[([-\d ]*)\] \[([-\d ]*)\]")


def split_dataset(spec: str, function: Any, split: str) -> Any:
    """`function(split)`, checked: a finite tf.data.Dataset of `(features, label)` pairs of dense tensors.

    Raises:
        UsageError: naming the source and what it returned instead.
        TransientError: the function raised a transient error (`trainer.core.user_errors`), for the caller to retry.
    """
    import tensorflow as tf

    setting = f"source 'fn:{spec}'"
    dataset = call_once(function, setting, split)
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
    for name, component in zip(component_names(element), tf.nest.flatten(element), strict=True):
        if not isinstance(component, tf.TensorSpec):
            raise UsageError(
                f"{setting} gives {name} as {type(component).__name__} for split {split!r}; allowed: dense tensors of "
                f"{SHAPES_ALLOWED}"
            )
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise UsageError(f"{setting} returned an endless dataset for split {split!r}; allowed: a finite one")
    return dataset


def component_names(element: Any) -> list[str]:
    """The names of a `(features, label)` structure's tensors in `tf.nest.flatten` order: `features['age']`, `label`."""

    def walk(node: Any, name: str) -> list[str]:
        if isinstance(node, dict):
            return [n for key in sorted(node) for n in walk(node[key], f"{name}[{key!r}]")]
        if isinstance(node, (tuple, list)):
            return [n for i, item in enumerate(node) for n in walk(item, f"{name}[{i}]")]
        return [name]

    return walk(element[0], "features") + walk(element[1], "label")


def _shape_checked(dataset: Any) -> Any:
    """`dataset`, failing at the first example whose open-shaped tensor differs in shape from the first example's."""
    import tensorflow as tf

    flat = tf.nest.flatten(dataset.element_spec)
    open_ = [k for k, spec in enumerate(flat) if not spec.shape.is_fully_defined()]
    if not open_:
        return dataset

    def padded(shape, to):
        return tf.pad(shape, [[0, tf.maximum(0, tf.size(to) - tf.size(shape))]])

    def step(firsts, indexed):
        index, element = indexed
        tensors = tf.nest.flatten(element)
        kept = []
        for first, k in zip(firsts, open_, strict=True):
            shape = tf.shape(tensors[k], out_type=tf.int64)
            same = tf.logical_and(
                tf.equal(tf.size(shape), tf.size(first)),
                tf.reduce_all(tf.equal(padded(shape, first), padded(first, shape))),
            )
            message = tf.strings.format(_SHAPE_CHECK + " {} {} {} {}", (k, index, first, shape), summarize=-1)
            check = tf.debugging.Assert(tf.logical_or(tf.equal(index, 0), same), [message])
            with tf.control_dependencies([check]):
                kept.append(tf.cond(tf.equal(index, 0), lambda s=shape: s, lambda f=first: f))
        return tuple(kept), element

    initial = tuple(tf.constant([], tf.int64) for _ in open_)
    return dataset.enumerate().scan(initial, step)


def _shape_error(err: Any, setting: str, split: str, element: Any) -> UsageError | None:
    """The one line for a failed shape check (`_shape_checked`), or None when `err` is another error."""
    match = _SHAPE_FAILED.search(str(getattr(err, "message", "") or ""))
    if not match:
        return None
    k, index, first, shape = match.groups()
    name = component_names(element)[int(k)]
    return UsageError(
        f"{setting} gives {name} of shape [{', '.join(first.split())}] in example 0 of split {split!r} but of "
        f"shape [{', '.join(shape.split())}] in example {index}; allowed: {SHAPES_ALLOWED}"
    )


def _write(dataset: Any, path: str) -> int:
    """Writes `dataset` in `tf.data.Dataset.save`'s format as one shard; returns how many examples it wrote.

    `Dataset.save` itself waits forever when the dataset fails after its first element (tensorflow/tensorflow#61736,
    seen here with TF 2.21): the same writer as a dataset that writes what passes through it (`save_dataset_v2`,
    what `save(checkpoint_args=...)` uses) is counted through in one `tf.data` pass instead, which raises the first
    error reading the dataset raised. That writer records no count in the split's metadata (`load_split` asserts
    the one counted here).
    """
    import numpy as np
    from tensorflow.python.data.ops import save_op

    writer = getattr(save_op, "_SaveDataset", None)
    if writer is None:
        dataset.save(path, shard_func=_one_shard)
        return int(_read(path).reduce(np.int64(0), _plus_one))
    return int(writer(dataset, path, _one_shard, None).reduce(np.int64(0), _plus_one))


def _plus_one(count: Any, *_: Any) -> Any:
    return count + 1


def _save_split(spec: str, function: Any, split: str, limit: int, path: str) -> tuple[int, Any]:
    """`function(split)` (at most `limit` examples) written to `path`: its example count and static element spec.

    A transient error of the function, or of TensorFlow reading its dataset, starts the split again (`retried`).
    """
    import tensorflow as tf

    from trainer.core.files import remove_tree

    setting = f"source 'fn:{spec}'"

    def attempt() -> tuple[int, Any]:
        remove_tree(path)
        dataset = split_dataset(spec, function, split)
        if limit:
            dataset = dataset.take(limit)
        element = dataset.element_spec
        checked = _shape_checked(dataset)
        try:
            # One shard, read back in order (`load_split`): by default save spreads elements over as many shards
            # as this machine has CPUs and load interleaves them by the reading machine's CPUs, so each worker's
            # every-Nth share would depend on the nodes the pods landed on.
            count = _write(checked, path)
        except tf.errors.OpError as err:
            found = _shape_error(err, setting, split, element) or judge(err, f"{setting}: reading split {split!r}")
            raise found from None
        if count < 1:
            raise UsageError(f"{setting} returned no examples for split {split!r}; allowed: at least 1")
        return count, _static(_read(path)).element_spec

    return retried(attempt, setting)


def prepare_function(spec: str, config: DataConfig, out: str) -> DatasetMetadata:
    """Saves both splits of `function(split)` into `out` (at most max_*_examples each); returns the metadata.

    Raises:
        UsageError: the function, its dataset or its examples are not what is allowed (exit 2).
        StoreUnavailableError: a transient error lasted through every attempt (142).
    """
    function = load(spec, f"source 'fn:{spec}'")
    limits = {"train": config.max_train_examples, "test": config.max_test_examples}
    splits = {}
    specs = {}
    for split in SPLITS:
        count, specs[split] = _save_split(spec, function, split, limits[split], f"{out}/{split}")
        splits[split] = Split(count, directory=split)
    if specs["train"] != specs["test"]:
        raise UsageError(
            f"source 'fn:{spec}' returned train examples of {specs['train']} but test examples of {specs['test']}; "
            "allowed: the same features and label for both"
        )
    return DatasetMetadata.of_saved(f"fn:{spec}", str(specs["train"]), splits)


def _one_shard(*_: Any) -> Any:
    import tensorflow as tf

    return tf.constant(0, tf.int64)


def _in_order(shards: Any) -> Any:
    return shards.flat_map(lambda shard: shard)


def _read(path: str) -> Any:
    import tensorflow as tf

    return tf.data.Dataset.load(path, reader_func=_in_order)


def _static(dataset: Any) -> Any:
    """A saved split with the static shapes its examples share (checked when it was written) in its element spec."""
    import tensorflow as tf

    flat = tf.nest.flatten(dataset.element_spec)
    if all(spec.shape.is_fully_defined() for spec in flat):
        return dataset
    first = tf.nest.flatten(next(iter(dataset.take(1))))
    shapes = [tensor.shape for tensor in first]

    def with_shapes(features, label):
        pair = (features, label)
        tensors = [tf.ensure_shape(t, s) for t, s in zip(tf.nest.flatten(pair), shapes, strict=True)]
        return tf.nest.pack_sequence_as(pair, tensors)

    return dataset.map(with_shapes)


def split_bytes(data_dir: str, meta: DatasetMetadata, split: str) -> int:
    """The bytes of a saved split's files (its tensors as written: tf.data's save format, uncompressed)."""
    import tensorflow as tf

    total = 0
    for directory, _, files in tf.io.gfile.walk(f"{data_dir.rstrip('/')}/{meta.split(split, data_dir).directory}"):
        total += sum(tf.io.gfile.stat(f"{directory.rstrip('/')}/{name}").length for name in files)
    return total


def load_split(data_dir: str, meta: DatasetMetadata, split: str) -> Any:
    """A saved split as the function returned it: unbatched `(features, label)` pairs of static shapes.

    Raises:
        UsageError: the split is not in the dataset or its files are missing.
    """
    import tensorflow as tf

    from trainer.core.files import exists

    found = meta.split(split, data_dir)
    path = f"{data_dir.rstrip('/')}/{found.directory}"
    if not exists(f"{path}/dataset_spec.pb"):
        raise UsageError(f"dataset split {path!r} is missing (no dataset_spec.pb written by tf.data.Dataset.save)")
    return _static(_read(path)).apply(tf.data.experimental.assert_cardinality(found.num_examples))
