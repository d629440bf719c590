"""The model of the data-at-scale bench (`bench/scale.py`): a small CNN for 96x96x3 images, given as a model_fn.

    trainer-launch --workers 2 -- --model-fn bench.scale_model:small_cnn --data DATASET ...

Two strided convolutions, global pooling and a softmax: about 12 MFLOP per training example, so that reading and
decoding the 27 KB images, not the arithmetic, sets the pace, and a pass over a 2 GB dataset takes seconds per
worker rather than the minutes the built-in CNN would need at this size.
"""


def small_cnn(features):
    """A compiled tf-keras model for `features` (one uint8-valued image as float32) with 10 classes."""
    import tf_keras as keras

    inputs = keras.Input(shape=features.shape, name="image")
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    x = keras.layers.Conv2D(16, 5, strides=4, activation="relu")(x)
    x = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="probabilities")(x)
    model = keras.Model(inputs, outputs, name="small_cnn")
    model.compile(optimizer=keras.optimizers.Adam(0.003), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
