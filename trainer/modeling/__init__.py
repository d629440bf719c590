"""The model and its export: the CNN, its serving signature, the SavedModel the chief writes."""
