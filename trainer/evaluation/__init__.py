"""Evaluation of an exported model on held-out data, and the HTML report."""
