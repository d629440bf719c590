"""The model directory's layout: what the training step's Model artifact holds beside history.json."""

SAVED_MODEL_DIR = "saved_model"
KERAS_FILE = "model.keras"
