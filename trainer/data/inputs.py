"""Input pipelines: a worker's share of the prepared dataset as `tf.data` datasets for training and evaluation.

A prepared dataset is either TFRecord shards of uint8 images (fed as float32) or the splits of your own function
saved by tf.data (`trainer.data.user_source`, fed as the function returned them).

A worker keeps its share where `trainer.core.memory.choose_cache` says, one log line each: in memory when it fits a
quarter of the pod's memory limit, else in a tf.data file cache in the local temporary directory when it fits half
of the free space there, else nowhere (read from the dataset every epoch). The share's size is what the cache would
hold: for TFRecord shards the decoded images and labels (`image_shape` and the example counts of the metadata), for
a saved split its files' bytes in proportion to the worker's examples. A kept share is decoded once, as it is
cached; a streamed one is shuffled and batched as its files are read, and each batch decoded (`readers.Share`).
"""

from __future__ import annotations

import atexit
import logging
import os
import uuid
from typing import Any

from trainer.config.contract import DataConfig
from trainer.core.memory import CacheChoice, Room, choose_cache, room
from trainer.data import readers
from trainer.data.readers import Reader, Share
from trainer.records.dataset import DatasetMetadata

log = logging.getLogger(__name__)

CACHE_DIR_NAME = "trainer-data-cache"


def _nothing(*_: Any) -> bool:
    return False


def _reader(data_dir: str, meta: DatasetMetadata, reader: Reader | None) -> Reader:
    return reader if reader is not None else readers.of(data_dir, meta)


def examples(data_dir: str, meta: DatasetMetadata, split: str, reader: Reader | None = None) -> Any:
    """A whole split, unbatched, as training feeds it: `(features, label)` pairs (images as float32)."""
    reader = _reader(data_dir, meta, reader)
    return reader.fed(reader.stored(split))


def features_spec(data_dir: str, meta: DatasetMetadata, reader: Reader | None = None) -> Any:
    """The `tf.TensorSpec` (or dict of them) of one example's features as training feeds them."""
    return examples(data_dir, meta, "train", reader).element_spec[0]


def _share_examples(meta: DatasetMetadata, split: str, workers: int, rank: int) -> int:
    """How many of the split's examples are this worker's."""
    found = meta.splits[split]
    if found.shards and readers.by_file(list(found.shards), workers):
        return sum(s.num_examples for s in found.shards[rank::workers])
    return len(range(rank, found.num_examples, max(workers, 1)))


def share_bytes(
    data_dir: str, meta: DatasetMetadata, split: str, workers: int, rank: int, reader: Reader | None = None
) -> int:
    """The bytes this worker's share of `split` takes in a cache: decoded images and labels, or saved tensors."""
    count = _share_examples(meta, split, workers, rank)
    return _reader(data_dir, meta, reader).cache_bytes(split, count)


def cache_choice(
    data_dir: str,
    meta: DatasetMetadata,
    split: str,
    workers: int,
    rank: int,
    where: Room | None = None,
    reader: Reader | None = None,
) -> tuple[CacheChoice, Room]:
    """Where this worker keeps its share of `split` (`choose_cache`), logged in one line.

    The test split's share counts the training share against the same memory budget when that one is in memory.
    """
    where = where or room()
    used = 0
    if split != "train":
        train = choose_cache(share_bytes(data_dir, meta, "train", workers, rank, reader), where)
        used = train.share_bytes if train.where == "memory" else 0
    choice = choose_cache(share_bytes(data_dir, meta, split, workers, rank, reader), where, used)
    log.info(choice.describe(f"data cache: worker {rank}'s share of the {split} split", where.memory))
    return choice, where


def _cache_path(where: Room, split: str, workers: int, rank: int) -> str:
    """A fresh file-cache prefix under this process's own directory, which is removed when the process ends.

    Directories of processes that no longer run (a training process killed and restarted in place) are removed
    first, so the local disk does not fill up with their caches.
    """
    import shutil

    parent = os.path.join(where.disk_dir, CACHE_DIR_NAME)
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        if name.isdigit() and int(name) != os.getpid() and not _running(int(name)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    own = os.path.join(parent, str(os.getpid()))
    if not os.path.isdir(own):
        os.makedirs(own)
        atexit.register(shutil.rmtree, own, ignore_errors=True)
    return os.path.join(own, f"{split}-{rank}-of-{workers}-{uuid.uuid4().hex[:8]}")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _elements(share: Share, streamed: bool) -> Any:
    """What a share's epochs are shuffled from: the records as read when streamed, else the stored pairs (cached)."""
    import tensorflow as tf

    return share.read if streamed else share.stored(tf.data.AUTOTUNE)


def _decoded(share: Share, batches: Any, streamed: bool) -> Any:
    """Batches of `_elements` as batches of stored pairs: a streamed share's records decoded a batch at a time."""
    import tensorflow as tf

    return share.decoded(batches, tf.data.AUTOTUNE) if streamed else batches


def _kept(records: Any, choice: CacheChoice, where: Room, split: str, workers: int, rank: int) -> Any:
    """`records` cached where `choice` says (in memory, in a file cache, or not at all)."""
    if choice.where == "memory":
        return records.cache()
    if choice.where == "disk":
        return records.cache(_cache_path(where, split, workers, rank))
    return records


def _filled(records: Any, choice: CacheChoice) -> Any:
    """A pass that yields nothing and reads a cached share to its end (in batches); nothing for a streamed share.

    Batching needs one shape per feature, which `trainer.data.user_source` checks when your function's data is saved.
    """
    if choice.where == "stream":
        return records.take(0)
    return records.batch(4096).filter(_nothing).unbatch()


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
    meta: DatasetMetadata,
    data: DataConfig,
    batch_size: int,
    steps: int,
    workers: int,
    rank: int,
    start_epoch: int,
    threads: int = 0,
    where: Room | None = None,
    reader: Reader | None = None,
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
        where: the memory limit and local disk that decide where the share is kept (default: this pod's).
        reader: how the dataset is read (default: the reader of its format, `trainer.data.readers.of`).

    Returns:
        An endless dataset of `(float32 images, int64 labels)` global batches, or of the saved function's
        `(features, label)` pairs batched.
    """
    import tensorflow as tf

    reader = _reader(data_dir, meta, reader)
    share = reader.share("train", workers, rank, threads)
    choice, where = cache_choice(data_dir, meta, "train", workers, rank, where, reader)
    streamed = choice.where == "stream"
    records = _kept(_elements(share, streamed), choice, where, "train", workers, rank)
    # tf.data keeps a cache only once an iterator has read it to the end, and an epoch shorter than this worker's
    # share (--steps-per-epoch) stops mid-way: the cache would be thrown away and every epoch would read and decode
    # the files again. This pass yields nothing and reads the cache to the end, so it is filled once (in batches:
    # over a filled cache that takes 0.1 s for 60,000 images, against 1.3 s one element at a time). A streamed
    # share has no cache to fill.
    fill = _filled(records, choice)
    per_epoch = steps * batch_size
    buffer = min(meta.num_examples("train"), data.shuffle_buffer)

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
    ds = _decoded(share, ds.batch(batch_size * workers, drop_remainder=True), streamed)
    ds = reader.fed(ds, tf.data.AUTOTUNE)
    return ds.prefetch(tf.data.AUTOTUNE).with_options(_options(deterministic=True, threads=threads))


def eval_dataset(
    data_dir: str,
    meta: DatasetMetadata,
    global_batch: int,
    workers: int,
    rank: int,
    threads: int = 0,
    where: Room | None = None,
    reader: Reader | None = None,
) -> Any:
    """This worker's share of the test split, repeated so every worker runs the same number of validation steps.

    The share is kept where `cache_choice` says, the training share counted against the same memory budget.
    """
    reader = _reader(data_dir, meta, reader)
    ds = reader.stored("test")
    if workers > 1:
        ds = ds.shard(workers, rank)
    choice, where = cache_choice(data_dir, meta, "test", workers, rank, where, reader)
    ds = _kept(ds, choice, where, "test", workers, rank)
    # Filled to its end first, as the training share is: a validation run reads fewer batches than the share holds.
    ds = _filled(ds, choice).concatenate(ds.repeat())
    ds = reader.fed(ds).batch(global_batch, drop_remainder=True)
    return ds.with_options(_options(deterministic=False, threads=threads))


def ps_dataset_creator(data_dir: str, meta: DatasetMetadata, data: DataConfig, batch_size: int) -> Any:
    """A `DatasetCreator` for ParameterServerStrategy: each worker reads only its input pipeline's share.

    The share is taken as under MultiWorkerMirroredStrategy (`Reader.share`): whole shard files when they divide
    evenly among the input pipelines, so a worker opens only its own files, else every N-th record.

    A share is cached in memory only when `choose_cache` allows it under this (the chief's) pod's memory limit, which
    stands for the workers' (one pod template); never on disk: the function runs on the workers, whose disks the
    chief cannot see.
    """
    import tensorflow as tf
    import tf_keras as keras

    from trainer.core.memory import memory_limit

    reader = _reader(data_dir, meta, None)
    where = Room(memory_limit(), "", 0)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        pipelines, index = context.num_input_pipelines, context.input_pipeline_id
        share = reader.share("train", pipelines, index)
        choice = choose_cache(share_bytes(data_dir, meta, "train", pipelines, index, reader), where)
        log.info(choice.describe(f"data cache: input pipeline {index}'s share of the train split", where.memory))
        streamed = choice.where != "memory"
        ds = _elements(share, streamed)
        if not streamed:
            ds = ds.cache()
        ds = ds.shuffle(data.shuffle_buffer, seed=data.seed).repeat().batch(batch_size, drop_remainder=True)
        return reader.fed(_decoded(share, ds, streamed), tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    return keras.utils.experimental.DatasetCreator(dataset_fn)
