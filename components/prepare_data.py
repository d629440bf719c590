"""The `prepare_data` step: a data source -> TFRecord shards + metadata as a Dataset artifact."""

from kfp.dsl import Dataset, Output


def prepare_data(
    source: str,
    dataset: Output[Dataset],
    max_train_examples: int = 0,
    max_test_examples: int = 0,
    num_shards: int = 4,
):
    """Prepares an image-classification dataset as TFRecord shards with a metadata.json.

    Args:
        source: 'sample' (the MNIST digits shipped in the image), 'idx:URI' (MNIST-format IDX files at a local
            path or a tf.io.gfile URI), or a TFDS name such as 'mnist' or 'tfds:fashion_mnist'.
        dataset: the prepared dataset: train and test TFRecord shards and metadata.json with counts and checksums.
        max_train_examples: keep only the first N training examples; 0 keeps all.
        max_test_examples: keep only the first N test examples; 0 keeps all.
        num_shards: number of training shards; a multiple of the worker count lets each worker read whole files.
    """
    import json
    import sys

    from trainer import prepare

    args = ["--source", source, "--output", dataset.path, "--num-shards", str(num_shards)]
    if max_train_examples:
        args += ["--max-train", str(max_train_examples)]
    if max_test_examples:
        args += ["--max-test", str(max_test_examples)]
    code = prepare.main(args)
    if code:
        sys.exit(code)
    with open(f"{dataset.path}/metadata.json") as f:
        meta = json.load(f)
    dataset.metadata.update({
        "source": source,
        "train_examples": meta["splits"]["train"]["num_examples"],
        "test_examples": meta["splits"]["test"]["num_examples"],
        "num_classes": meta["num_classes"],
    })
