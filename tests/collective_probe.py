"""One worker of a 2-worker MultiWorkerMirroredStrategy fit, reporting its collectives and its logs as JSON.

    python -m tests.collective_probe RANK PORT0,PORT1 keras|local OUT.json

Each worker trains the project's CNN for 4 steps on data of its own (worker 0 sees dark images of class 0,
worker 1 bright images of class 1), so the two workers' own metrics differ while their aggregate is one value.
Writes the number of collective ops in one traced training step, every per-batch log and the epoch's log.
"""

import json
import os
import sys


def main():
    rank, ports, mode, out = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": rank}}
    )
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from trainer.modeling.cnn import build_model
    from trainer.training.collectives import local_step_metrics

    keras.utils.set_random_seed(7)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model((28, 28, 1), 10, 0.001)
    if mode == "local":
        local_step_metrics(model)
    images = np.full((256, 28, 28, 1), 40.0 + 180.0 * rank, dtype="float32")
    images += np.random.default_rng(rank).uniform(0, 20, images.shape).astype("float32")
    labels = np.full((256,), rank, dtype="int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32).repeat().with_options(options)
    batches = []

    class Batches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append({k: float(v) for k, v in logs.items()})

    history = model.fit(data, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[Batches()])
    (traced,) = model.train_tf_function._list_all_concrete_functions_for_serialization()
    graph = traced.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    collectives = sum(1 for n in nodes if n.op.startswith("Collective") and "Reduce" in n.op)
    with open(out, "w") as f:
        json.dump(
            {
                "collectives": collectives,
                "batches": batches,
                "epoch": {k: v[0] for k, v in history.history.items()},
            },
            f,
        )


if __name__ == "__main__":
    main()
