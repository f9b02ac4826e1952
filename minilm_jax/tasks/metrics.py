"""The official GLUE metrics (and macro-F1 for the user's own tasks), from scikit-learn and scipy."""

import warnings

import numpy as np
from scipy import stats
from sklearn import metrics


def accuracy(labels, predictions) -> float:
  return float(metrics.accuracy_score(labels, predictions))


def f1(labels, predictions) -> float:
  """Binary F1 of the positive class 1 (MRPC, QQP)."""
  return float(metrics.f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))


def macro_f1(labels, predictions) -> float:
  """The mean of every class's F1, each class weighted alike."""
  return float(metrics.f1_score(labels, predictions, average="macro", zero_division=0))


def matthews(labels, predictions) -> float:
  """Matthews correlation (CoLA), multi-class form; 0 when a marginal is constant (scikit-learn
  warns about a single class then, which a small dev set can have)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    return float(metrics.matthews_corrcoef(labels, predictions))


def _correlation(function, x, y) -> float:
  """NaN (scipy warns) when a side is constant, as a model that predicts one score gives."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", stats.ConstantInputWarning)
    return float(function(np.asarray(x, np.float64), np.asarray(y, np.float64)).statistic)


def pearson(x, y) -> float:
  return _correlation(stats.pearsonr, x, y)


def spearman(x, y) -> float:
  return _correlation(stats.spearmanr, x, y)


METRICS = {
  "accuracy": accuracy,
  "f1": f1,
  "macro_f1": macro_f1,
  "matthews": matthews,
  "pearson": pearson,
  "spearman": spearman,
}
