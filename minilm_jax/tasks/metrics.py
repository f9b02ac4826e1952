"""The official GLUE metrics, in numpy."""

import numpy as np


def accuracy(labels, predictions) -> float:
  return float(np.mean(np.asarray(labels) == np.asarray(predictions)))


def f1(labels, predictions) -> float:
  """Binary F1 of the positive class 1 (MRPC, QQP)."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  tp = np.sum((predictions == 1) & (labels == 1))
  wrong = np.sum(predictions != labels)
  return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def matthews(labels, predictions) -> float:
  """Matthews correlation (CoLA), multi-class form; 0 when a marginal is constant."""
  labels, predictions = np.asarray(labels), np.asarray(predictions)
  classes = np.union1d(labels, predictions)
  confusion = (labels[:, None] == classes)[:, :, None] & (predictions[:, None] == classes)[:, None, :]
  c = confusion.sum(0).astype(np.float64)
  t, p, correct, n = c.sum(1), c.sum(0), np.trace(c), c.sum()
  denominator = np.sqrt((n * n - p @ p) * (n * n - t @ t))
  return float((correct * n - t @ p) / denominator) if denominator else 0.0


def pearson(x, y) -> float:
  x, y = np.asarray(x, np.float64) - np.mean(x), np.asarray(y, np.float64) - np.mean(y)
  return float((x @ y) / np.sqrt((x @ x) * (y @ y)))


def _ranks(x):
  """Ranks from 1, ties sharing their average rank."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x), np.float64)
  sorted_x = x[order]
  start = 0
  for end in range(1, len(x) + 1):
    if end == len(x) or sorted_x[end] != sorted_x[start]:
      ranks[order[start:end]] = (start + end + 1) / 2
      start = end
  return ranks


def spearman(x, y) -> float:
  return pearson(_ranks(x), _ranks(y))


METRICS = {"accuracy": accuracy, "f1": f1, "matthews": matthews, "pearson": pearson, "spearman": spearman}
