"""The `prepare_data` step: a data source -> TFRecord shards (or your function's splits) + metadata, as a Dataset."""

from kfp.dsl import Dataset, Output


def prepare_data(
    dataset: Output[Dataset],
    source: str,
    max_train_examples: int,
    max_test_examples: int,
    num_shards: int,
    data_uri: str,
    run_id: str,
    storage: str,
    s3_endpoint: str,
):
    """Prepares an image-classification dataset as TFRecord shards, or your function's splits, with a metadata.json.

    Args:
        dataset: the prepared dataset: train and test TFRecord shards and metadata.json with counts and checksums,
            or (source fn:...) each split as tf.data.Dataset.save wrote it, with metadata.json; with data_uri, only
            metadata.json, naming where the shards are (its metadata's location: DATA_URI/<run key>).
    """
    from trainer import steps
    from trainer.core.entry import run_step

    dataset.metadata.update(
        run_step(
            steps.prepare_data,
            output=dataset.path,
            source=source,
            max_train_examples=max_train_examples,
            max_test_examples=max_test_examples,
            num_shards=num_shards,
            data_uri=data_uri,
            run_id=run_id,
            storage=storage,
            s3_endpoint=s3_endpoint,
        )
    )
