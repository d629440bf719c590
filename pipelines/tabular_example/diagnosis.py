"""Breast-cancer diagnosis from 30 cell-nucleus measurements, trained on any number of workers.

A user's own TensorFlow program, as a team would write it for a TFJob: it reads TF_CONFIG through
MultiWorkerMirroredStrategy (one process without TF_CONFIG is the single-process baseline), checkpoints with
BackupAndRestore, and the chief saves the model and its test metrics. It uses tf-keras (Keras 2), as TensorFlow's
multi-worker guide does: Keras 3's `fit` fails under MultiWorkerMirroredStrategy. The data is the Wisconsin
diagnostic data set that scikit-learn ships (569 tumours, 212 malignant): nothing is downloaded.

    python diagnosis.py --model_dir /tmp/diagnosis --checkpoint_dir /tmp/diagnosis-ckpt    # the baseline

The same module also runs in module mode, where this project's runner trains and evaluates the model and its
pipeline gates, serves, publishes and deploys it: `datasets` and `model` are all it needs.

    python pipelines/mnist.py --local --source fn:diagnosis:datasets --model-fn diagnosis:model --gate 'auc>=0.98'
"""

import argparse
import json
import os

import tensorflow as tf
import tf_keras as keras
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split


def load_data(seed):
    """Standardised train and test splits (75/25, stratified); the scaling is learnt on the training split."""
    features, labels = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        features, labels, test_size=0.25, random_state=seed, stratify=labels
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    return (
        ((x_train - mean) / std).astype("float32"),
        y_train.astype("float32"),
        ((x_test - mean) / std).astype("float32"),
        y_test.astype("float32"),
    )


def build_model(num_features):
    """A small fully connected network with a malignancy probability as its output."""
    model = keras.Sequential(
        [
            keras.layers.Input(shape=(num_features,), name="measurements"),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid", name="malignant"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), "accuracy"],
    )
    return model


SEED = 7


def datasets(split):
    """Module mode's data (source fn:diagnosis:datasets): split 'train' or 'test' as (measurements, label) pairs."""
    if split not in ("train", "test"):
        raise ValueError(f"split {split!r}; allowed: train, test")
    x_train, y_train, x_test, y_test = load_data(SEED)
    features, labels = (x_train, y_train) if split == "train" else (x_test, y_test)
    return tf.data.Dataset.from_tensor_slices((features, labels))


def model(features):
    """Module mode's model (model_fn diagnosis:model) for the features' spec: one example's 30 measurements."""
    return build_model(features.shape[0])


def is_chief(resolver):
    """TensorFlow's rule: the chief task if there is one, else worker 0 (or a single process)."""
    return resolver.task_type in (None, "chief") or (resolver.task_type == "worker" and resolver.task_id == 0)


def main(args):
    """Trains, evaluates on the held-out split and, on the chief, saves the model and its metrics."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    global_batch = args.batch_size_per_replica * strategy.num_replicas_in_sync
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train), seed=args.seed)
        .batch(global_batch)
        .repeat()
        .with_options(options)
    )
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(global_batch).with_options(options)
    with strategy.scope():
        model = build_model(x_train.shape[1])
    model.fit(
        train,
        epochs=args.epochs,
        steps_per_epoch=len(x_train) // global_batch,
        callbacks=[keras.callbacks.BackupAndRestore(backup_dir=args.checkpoint_dir)],
        verbose=2,
    )
    metrics = model.evaluate(test, verbose=0, return_dict=True)
    print(f"replicas {strategy.num_replicas_in_sync}: test " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if is_chief(strategy.cluster_resolver):
        model.save(os.path.join(args.model_dir, "saved_model"))
        with open(os.path.join(args.model_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f)
    else:
        scratch = os.path.join(args.model_dir, f"worker-{strategy.cluster_resolver.task_id}-scratch")
        model.save(scratch)
        tf.io.gfile.rmtree(scratch)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default=os.environ.get("MODEL_DIR", "model"))
    parser.add_argument("--checkpoint_dir", default=os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch_size_per_replica", type=int, default=16)
    parser.add_argument("--seed", type=int, default=SEED)
    main(parser.parse_args())
