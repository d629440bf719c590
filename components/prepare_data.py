"""The `prepare_data` step: a data source -> TFRecord shards + metadata as a Dataset artifact."""

from kfp.dsl import Dataset, Output


def prepare_data(
    dataset: Output[Dataset], source: str, max_train_examples: int, max_test_examples: int, num_shards: int
):
    """Prepares an image-classification dataset as TFRecord shards with a metadata.json.

    Args:
        dataset: the prepared dataset: train and test TFRecord shards and metadata.json with counts and checksums.
    """
    from trainer import steps
    from trainer.cli import run_step

    dataset.metadata.update(
        run_step(
            steps.prepare_data,
            output=dataset.path,
            source=source,
            max_train_examples=max_train_examples,
            max_test_examples=max_test_examples,
            num_shards=num_shards,
        )
    )
