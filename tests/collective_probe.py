"""One worker of a 2-worker MultiWorkerMirroredStrategy fit, reporting its collectives and its logs as JSON.

    python -m tests.collective_probe RANK PORT0,PORT1 MODE[,MODE...] OUT.json     # MODE: keras or local

For each MODE in turn, on one strategy, each worker trains the project's CNN (the same initial weights each time)
for 4 steps on data of its own (worker 0 sees dark images of class 0, worker 1 bright images of class 1), so the
two workers' own metrics differ while their aggregate is one value. Writes, by MODE, the number of collective ops in
one traced training step, every per-batch log and the epoch's log.
"""

import json
import os
import sys


def main():
    rank, ports, modes, out = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": [f"localhost:{p}" for p in ports]}, "task": {"type": "worker", "index": rank}}
    )
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from trainer.modeling.cnn import build_model
    from trainer.training.collectives import local_step_metrics

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    images = np.full((256, 28, 28, 1), 40.0 + 180.0 * rank, dtype="float32")
    images += np.random.default_rng(rank).uniform(0, 20, images.shape).astype("float32")
    labels = np.full((256,), rank, dtype="int64")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(32).repeat().with_options(options)

    class Batches(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.logs = []

        def on_train_batch_end(self, batch, logs=None):
            self.logs.append({k: float(v) for k, v in logs.items()})

    found = {}
    for mode in modes.split(","):
        keras.utils.set_random_seed(7)
        with strategy.scope():
            model = build_model((28, 28, 1), 10, 0.001)
        if mode == "local":
            local_step_metrics(model)
        batches = Batches()
        history = model.fit(data, epochs=1, steps_per_epoch=4, verbose=0, callbacks=[batches])
        (traced,) = model.train_tf_function._list_all_concrete_functions_for_serialization()
        graph = traced.graph.as_graph_def()
        nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
        found[mode] = {
            "collectives": sum(1 for n in nodes if n.op.startswith("Collective") and "Reduce" in n.op),
            "batches": batches.logs,
            "epoch": {k: v[0] for k, v in history.history.items()},
        }
    with open(out, "w") as f:
        json.dump(found, f)


if __name__ == "__main__":
    main()
