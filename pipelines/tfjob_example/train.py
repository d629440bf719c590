"""Multi-worker MNIST with Keras, written the TFJob way.

After kubeflow/training-operator's examples/tensorflow/distribution_strategy/keras-API/
multi_worker_strategy-with-keras.py: it reads TF_CONFIG through MultiWorkerMirroredStrategy, checkpoints with
BackupAndRestore, and the chief saves the model while the other workers save to a temporary directory and delete
it. The only change: it reads MNIST-format IDX files from --data_dir instead of downloading with
tensorflow_datasets (nothing is downloaded at run time here). It knows nothing of Kubeflow Pipelines.
"""

import argparse
import gzip
import json
import os

import numpy as np
import tensorflow as tf


def read_idx(path):
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def make_dataset_unbatched(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))[..., None].astype("float32") / 255.0
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz")).astype("int64")
    return tf.data.Dataset.from_tensor_slices((images, labels)), len(labels)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
        metrics=["accuracy"],
    )
    return model


def is_chief(task_type, task_id):
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    if is_chief(task_type, task_id):
        return filepath
    return _get_temp_dir(os.path.dirname(filepath), task_id)


def main(args):
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
        )
    )
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    print(f"TF_CONFIG task: {tf_config.get('task')}, replicas in sync: {strategy.num_replicas_in_sync}", flush=True)

    batch_size = args.batch_size_per_replica * strategy.num_replicas_in_sync
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train, examples = make_dataset_unbatched(args.data_dir, "train")
    train = train.cache().shuffle(10000, seed=42).batch(batch_size).repeat().with_options(options)
    test, _ = make_dataset_unbatched(args.data_dir, "t10k")
    test = test.batch(batch_size).with_options(options)

    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()

    callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=args.checkpoint_dir)]
    multi_worker_model.fit(
        train, epochs=args.epochs, steps_per_epoch=examples // batch_size, callbacks=callbacks, verbose=2
    )
    loss, accuracy = multi_worker_model.evaluate(test, verbose=0)
    print(f"test accuracy {accuracy:.4f}, loss {loss:.4f}", flush=True)

    task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id
    saved_model_path = write_filepath(args.saved_model_dir, task_type, task_id)
    multi_worker_model.save(saved_model_path)
    if is_chief(task_type, task_id):
        if args.metrics_file:
            with open(args.metrics_file, "w") as f:
                json.dump({"accuracy": accuracy, "loss": loss}, f)
    else:
        tf.io.gfile.rmtree(os.path.dirname(saved_model_path) + "/workertemp_" + str(task_id))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True, help="MNIST-format IDX files (train-*, t10k-*)")
    parser.add_argument("--saved_model_dir", required=True, help="where the chief saves the model")
    parser.add_argument("--checkpoint_dir", required=True, help="BackupAndRestore's directory, shared by every worker")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size_per_replica", type=int, default=64)
    parser.add_argument("--metrics_file", default="", help="the chief writes test accuracy and loss here (JSON)")
    main(parser.parse_args())
