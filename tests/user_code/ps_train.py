"""A TFJob-era parameter-server script, as TensorFlow's "Parameter server training with Model.fit" guide writes it.

Parameter servers and workers start a TensorFlow server and join it forever; the chief builds a
ParameterServerStrategy from TF_CONFIG, fits with a DatasetCreator and saves the model. FAIL_AT_START=1 makes the
chief fail before it trains; EPOCHS sets the epochs (3).
"""

import os
import sys

import numpy as np
import tensorflow as tf
import tf_keras as keras


def main():
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(
            resolver.cluster_spec(),
            job_name=resolver.task_type,
            task_index=resolver.task_id,
            protocol=resolver.rpc_layer or "grpc",
            start=True,
        )
        print(f"{resolver.task_type} {resolver.task_id}: serving", flush=True)
        server.join()
        return 0
    if os.environ.get("FAIL_AT_START") == "1":
        print("chief: cannot find its data", file=sys.stderr, flush=True)
        return 1
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)

    def dataset_fn(context):
        rng = np.random.default_rng(context.input_pipeline_id)
        x = rng.uniform(-1, 1, (512, 4)).astype("float32")
        y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32")).astype("float32")
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512).repeat().batch(32)

    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), loss="mse", steps_per_execution=5)
    history = model.fit(
        keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=int(os.environ.get("EPOCHS", "3")),
        steps_per_epoch=20,
        verbose=2,
    )
    print(f"chief: trained, loss {history.history['loss'][-1]:.4f}", flush=True)
    model.save(os.path.join(os.environ["MODEL_DIR"], "saved_model"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
