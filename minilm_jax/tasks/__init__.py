"""Downstream tasks for fine-tuning and evaluation: data, features, losses, predictions, metrics."""
