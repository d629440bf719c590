"""A plain, non-distributed TFJob script: no TF_CONFIG, no TensorFlow server; fits a line for a while, then saves.

python single_task.py SECONDS
"""

import os
import sys
import time

import tensorflow as tf


def main() -> int:
    if "TF_CONFIG" in os.environ:
        print(f"TF_CONFIG is set for a one-task job: {os.environ['TF_CONFIG']}", file=sys.stderr)
        return 3
    seconds = float(sys.argv[1])
    started = time.monotonic()
    x = tf.linspace(-1.0, 1.0, 64)
    y = 3.0 * x + 0.5
    module = tf.Module()
    module.w, module.b = tf.Variable(0.0), tf.Variable(0.0)
    optimizer = tf.optimizers.SGD(0.1)
    steps = 0
    while time.monotonic() - started < seconds:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((module.w * x + module.b - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, [module.w, module.b]), [module.w, module.b], strict=True))
        steps += 1
    module.predict = tf.function(lambda v: module.w * v + module.b, input_signature=[tf.TensorSpec([None])])
    tf.saved_model.save(module, os.path.join(os.environ["MODEL_DIR"], "saved_model"))
    print(f"single task: {steps} steps in {time.monotonic() - started:.1f}s, w={module.w.numpy():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
