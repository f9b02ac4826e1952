"""The official GLUE metrics (and macro-F1 for the user's own tasks), from scikit-learn and scipy."""

import warnings

import numpy as np


# scikit-learn and scipy are imported where a score is computed: together they take about a second
# to import, and every program imports this module (through the task registry) whether or not it scores.
def _sklearn_metrics():
  from sklearn import metrics

  return metrics


def _stats():
  from scipy import stats

  return stats


def accuracy(labels, predictions) -> float:
  return float(_sklearn_metrics().accuracy_score(labels, predictions))


def f1(labels, predictions) -> float:
  """Binary F1 of the positive class 1 (MRPC, QQP)."""
  return float(_sklearn_metrics().f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def macro_f1(labels, predictions) -> float:
  """The mean of every class's F1, each class weighted alike."""
  return float(_sklearn_metrics().f1_score(labels, predictions, average="macro", zero_division=0))


def matthews(labels, predictions) -> float:
  """Matthews correlation (CoLA), multi-class form; 0 when a marginal is constant (scikit-learn
  warns about a single class then, which a small dev set can have)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    return float(_sklearn_metrics().matthews_corrcoef(labels, predictions))


def _correlation(name: str, x, y) -> float:
  """NaN (scipy warns) when a side is constant, as a model that predicts one score gives."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", _stats().ConstantInputWarning)
    return float(getattr(_stats(), name)(np.asarray(x, np.float64), np.asarray(y, np.float64)).statistic)


def pearson(x, y) -> float:
  return _correlation("pearsonr", x, y)


def spearman(x, y) -> float:
  return _correlation("spearmanr", x, y)


METRICS = {
  "accuracy": accuracy,
  "f1": f1,
  "macro_f1": macro_f1,
  "matthews": matthews,
  "pearson": pearson,
  "spearman": spearman,
}
