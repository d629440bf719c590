"""Input pipelines: a worker's share of the prepared dataset as `tf.data` datasets for training and evaluation.

A prepared dataset is either TFRecord shards of uint8 images (fed as float32) or the splits of your own function
saved by tf.data (`trainer.data.functions`, fed as the function returned them).
"""

from __future__ import annotations

from typing import Any

from trainer.config.contract import DataConfig
from trainer.data import functions
from trainer.data.tfrecords import decode_fn, shard_paths


def _as_float(images: Any, labels: Any) -> tuple[Any, Any]:
    import tensorflow as tf

    return tf.cast(images, tf.float32), labels


def _nothing(*_: Any) -> bool:
    return False


def _stored(data_dir: str, meta: dict[str, Any], split: str) -> Any:
    """A whole split as stored: `(uint8 image, label)` pairs, or your function's `(features, label)` pairs."""
    import tensorflow as tf

    if functions.is_saved(meta):
        return functions.load_split(data_dir, meta, split)
    return tf.data.TFRecordDataset(shard_paths(data_dir, meta, split)).map(decode_fn(tuple(meta["image_shape"])))


def _fed(meta: dict[str, Any], ds: Any) -> Any:
    """`ds` as training feeds it: images as float32; your function's pairs as they are."""
    return ds if functions.is_saved(meta) else ds.map(_as_float)


def examples(data_dir: str, meta: dict[str, Any], split: str) -> Any:
    """A whole split, unbatched, as training feeds it: `(features, label)` pairs (images as float32)."""
    return _fed(meta, _stored(data_dir, meta, split))


def features_spec(data_dir: str, meta: dict[str, Any]) -> Any:
    """The `tf.TensorSpec` (or dict of them) of one example's features as training feeds them."""
    return examples(data_dir, meta, "train").element_spec[0]


def _options(deterministic: bool, threads: int) -> Any:
    """Explicit sharding; with `threads`, tf.data's own pool that size (its default: every core of the machine)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if threads:
        options.threading.private_threadpool_size = threads
    if deterministic:
        options.deterministic = True
    return options


def train_dataset(
    data_dir: str,
    meta: dict[str, Any],
    data: DataConfig,
    batch_size: int,
    steps: int,
    workers: int,
    rank: int,
    start_epoch: int,
    threads: int = 0,
) -> Any:
    """This worker's share of the training data, reshuffled per epoch and globally batched.

    Sharding is explicit (whole files when they divide evenly among the workers, else every N-th record), and
    epoch `e` is a fixed function of (seed, e): exactly `steps x batch_size` records shuffled with seed + e. The
    stream starts at `start_epoch` (the finished epochs of a resumed run), so a restarted worker sees the same data
    the uninterrupted run would have.

    Args:
        data_dir: the prepared dataset.
        meta: its metadata.json.
        data: the data settings (shuffle buffer, seed).
        batch_size: examples per worker per step.
        steps: steps per epoch.
        workers: training workers in the cluster.
        rank: this worker's position among them.
        start_epoch: the first epoch to produce, counted from 0.
        threads: the size of tf.data's thread pool (0: tf.data's default).

    Returns:
        An endless dataset of `(float32 images, int64 labels)` global batches, or of the saved function's
        `(features, label)` pairs batched.
    """
    import tensorflow as tf

    saved = functions.is_saved(meta)
    if saved:
        records = functions.load_split(data_dir, meta, "train")
        if workers > 1:
            records = records.shard(workers, rank)
    else:
        files = shard_paths(data_dir, meta, "train")
        by_file = workers > 1 and len(files) % workers == 0
        names = tf.data.Dataset.from_tensor_slices(files)
        if by_file:
            names = names.shard(workers, rank)
        records = names.interleave(
            tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        records = records.map(
            decode_fn(tuple(meta["image_shape"])), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        if workers > 1 and not by_file:
            records = records.shard(workers, rank)
    records = records.cache()
    # tf.data keeps a cache only once an iterator has read it to the end, and an epoch shorter than this worker's
    # share (--steps-per-epoch) stops mid-way: the cache would be thrown away and every epoch would read and decode
    # the files again. This pass yields nothing and reads the cache to the end, so it is filled once (in batches:
    # over a filled cache that takes 0.1 s for 60,000 images, against 1.3 s one element at a time).
    # (Your function's features may have no fixed shape to batch: its split is read one example at a time.)
    fill = records.filter(_nothing) if saved else records.batch(4096).filter(_nothing).unbatch()
    per_epoch = steps * batch_size
    buffer = min(meta["splits"]["train"]["num_examples"], data.shuffle_buffer)

    def epoch_block(epoch):
        return (
            records.shuffle(buffer, seed=data.seed * 1000 + epoch, reshuffle_each_iteration=False)
            .repeat()
            .take(per_epoch)
        )

    # Endless, and declared so: with a finite or unknown cardinality MultiWorkerMirroredStrategy all-reduces a
    # "has data" flag across the workers before every step. `fit` ends each epoch after `steps` steps.
    epochs = tf.data.Dataset.counter(start_epoch).flat_map(epoch_block)
    ds = fill.concatenate(epochs).apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    ds = ds.batch(batch_size * workers, drop_remainder=True)
    if not saved:
        ds = ds.map(_as_float, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options(deterministic=True, threads=threads))


def eval_dataset(
    data_dir: str, meta: dict[str, Any], global_batch: int, workers: int, rank: int, threads: int = 0
) -> Any:
    """This worker's share of the test split, repeated so every worker runs the same number of validation steps."""
    ds = _stored(data_dir, meta, "test")
    if workers > 1:
        ds = ds.shard(workers, rank)
    ds = _fed(meta, ds.cache().repeat()).batch(global_batch, drop_remainder=True)
    return ds.with_options(_options(deterministic=False, threads=threads))


def ps_dataset_creator(data_dir: str, meta: dict[str, Any], data: DataConfig, batch_size: int) -> Any:
    """A `DatasetCreator` for ParameterServerStrategy: each worker reads its input pipeline's share of the shards."""
    import tensorflow as tf
    import tf_keras as keras

    files = shard_paths(data_dir, meta, "train")
    shape = tuple(meta["image_shape"])

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.TFRecordDataset(files).map(decode_fn(shape))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id).cache()
        ds = ds.shuffle(data.shuffle_buffer, seed=data.seed).repeat().map(lambda x, y: (tf.cast(x, tf.float32), y))
        return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    return keras.utils.experimental.DatasetCreator(dataset_fn)
