"""Functions that module mode must refuse, each with one line naming what is wrong."""

import numpy as np
import tensorflow as tf
import tf_keras as keras


def a_list(split):
    return [(1.0, 0)]


def single_tensors(split):
    return tf.data.Dataset.from_tensor_slices(np.zeros((4, 3), "float32"))


def endless(split):
    return tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), "float32"), np.zeros(4))).repeat()


def different_splits(split):
    width = 3 if split == "train" else 5
    return tf.data.Dataset.from_tensor_slices((np.zeros((4, width), "float32"), np.zeros(4)))


def empty_test(split):
    return tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), "float32"), np.zeros(4))).take(
        0 if split == "test" else 4
    )


def uncompiled(features):
    return keras.Sequential([keras.Input(shape=features.shape), keras.layers.Dense(1)])


def keras3(features):
    import keras as keras3

    model = keras3.Sequential([keras3.Input(shape=features.shape), keras3.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    return model


not_a_function = 3


def raising(split):
    raise ValueError(f"no data for {split} today")
