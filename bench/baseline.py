"""The baseline users compare us with: a plain single-process tf-keras `fit` on in-memory numpy arrays.

python bench/baseline.py --data PREPARED_DIR --epochs 3 --batch-size 64   -> one JSON line on stdout
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--examples", type=int, default=0, help="train on the first N examples only (0: all)")
    parser.add_argument(
        "--steps-per-execution", type=int, default=1, help="Keras compile option (default 1, Keras' own default)"
    )
    parser.add_argument("--cosine-decay", action="store_true", help="the trainer's schedule: cosine over all steps")
    parser.add_argument("--threads", type=int, default=0, help="TensorFlow's intra- and inter-op threads (0: its own)")
    parser.add_argument(
        "--step-times", action="store_true", help="also every step's seconds after the first epoch (step_seconds)"
    )
    args = parser.parse_args()

    import tensorflow as tf
    import tf_keras as keras

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    from trainer.data.tfrecords import read_arrays
    from trainer.modeling.cnn import build_model

    images, labels, meta = read_arrays(args.data, "train")
    if args.examples:
        images, labels = images[: args.examples], labels[: args.examples]
    x = images.astype("float32")
    keras.utils.set_random_seed(42)
    steps = len(x) // args.batch_size + (1 if len(x) % args.batch_size else 0)
    model = build_model(
        meta.image_shape,
        meta.num_classes,
        args.learning_rate,
        decay_steps=args.epochs * steps if args.cosine_decay else 0,
        steps_per_execution=args.steps_per_execution,
    )
    times, step_times = [], []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.start)

        def on_train_batch_begin(self, batch, logs=None):
            self.step_start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if times:
                step_times.append(time.perf_counter() - self.step_start)

    callbacks = [Timer()]
    model.fit(x, labels, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=0, callbacks=callbacks)
    result = {"epoch_seconds": times, "examples_per_epoch": len(x), "steps_per_epoch": steps}
    if args.step_times:
        result["step_seconds"] = step_times
    print(json.dumps(result))


if __name__ == "__main__":
    main()
