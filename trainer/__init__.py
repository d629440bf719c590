"""Distributed TensorFlow training for Kubeflow Pipelines: data prep, multi-worker training, evaluation."""

import os

__version__ = "0.1.0"

# `tf.keras` is tf-keras (Keras 2) in the trainer's processes and their children unless the environment already says
# otherwise. It is set here, before any module of the trainer imports TensorFlow (TensorFlow reads it once, when
# imported): the trainer trains tf-keras models (Keras 3's `fit` fails under MultiWorkerMirroredStrategy,
# keras-team/keras#20585), so a user's `tf.keras` model is one it can train; and without it `import tensorflow`
# loads Keras 3 as well, for nothing (about 1.3 s of a core in every process here).
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"
os.environ.setdefault(LEGACY_KERAS_ENV, "1")
