"""Distributed TensorFlow training for Kubeflow Pipelines: data prep, multi-worker training, evaluation."""

__version__ = "0.1.0"
