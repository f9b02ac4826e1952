"""Task metrics against scikit-learn/scipy, and the SQuAD 2.0 metric on hand-checked examples."""

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from minilm_jax.tasks import metrics
from minilm_jax.tasks.squad import SquadTask, exact_match, f1_score, normalize_answer, squad_v2_scores


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_equal_sklearn(seed):
  rng = np.random.default_rng(seed)
  y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
  assert metrics.accuracy(y, p) == pytest.approx(sklearn.metrics.accuracy_score(y, p))
  assert metrics.f1(y, p) == pytest.approx(sklearn.metrics.f1_score(y, p))
  assert metrics.matthews(y, p) == pytest.approx(sklearn.metrics.matthews_corrcoef(y, p))
  y3, p3 = rng.integers(0, 3, 200), rng.integers(0, 3, 200)  # multi-class MCC
  assert metrics.matthews(y3, p3) == pytest.approx(sklearn.metrics.matthews_corrcoef(y3, p3))


def test_degenerate_classification_metrics_match_sklearn():
  y = np.array([1, 1, 1, 1])
  assert metrics.matthews(y, y) == sklearn.metrics.matthews_corrcoef(y, y) == 0.0
  z = np.zeros(4, int)
  assert metrics.f1(z, z) == sklearn.metrics.f1_score(z, z, zero_division=0.0) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_correlations_equal_scipy_with_ties(seed):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 6, 100).astype(float)  # many ties, as STS-B's 0-5 scores have
  y = x + rng.normal(0, 2, 100)
  assert metrics.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y)[0])
  assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0])
  assert metrics.spearman(x, np.round(y)) == pytest.approx(scipy.stats.spearmanr(x, np.round(y))[0])


def test_squad_normalisation():
  assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
  assert normalize_answer("an apple, a pear and the plum") == "apple pear and plum"


def test_squad_exact_and_f1_by_hand():
  assert exact_match("Denver Broncos", "the denver broncos.") == 1
  # gold {denver, broncos}, predicted {broncos, team}: one in common, P = R = 1/2
  assert f1_score("Denver Broncos", "Broncos team") == pytest.approx(0.5)
  assert f1_score("", "") == 1.0 and f1_score("", "Broncos") == 0.0 and f1_score("Broncos", "") == 0.0


def test_squad_v2_scores_by_hand():
  gold = {"a": ["Denver Broncos", "The Broncos"],  # several gold answers: the best one counts
          "b": [],                                 # unanswerable
          "c": ["1990"], "d": []}
  predictions = {"a": "Broncos", "b": "", "c": "in 1990 or so", "d": "something"}
  scores = squad_v2_scores(gold, predictions)
  # a: exact 1 against "The Broncos" (articles dropped); b: 1; c: F1 = 2*(1/4*1)/(1/4+1) = 0.4; d: 0
  assert scores["exact"] == pytest.approx(100 * 2 / 4)
  assert scores["f1"] == pytest.approx(100 * (1 + 1 + 0.4 + 0) / 4)
  assert scores["HasAns_exact"] == pytest.approx(50) and scores["HasAns_f1"] == pytest.approx(70)
  assert scores["NoAns_exact"] == pytest.approx(50) and scores["HasAns_total"] == scores["NoAns_total"] == 2


def test_squad_decoding_rules():
  """Spans outside the passage or too long are skipped; the null answer wins past the threshold."""
  task = SquadTask()
  context = "alpha beta gamma"
  offsets = [[-1, -1], [-1, -1], [0, 5], [6, 10], [11, 16], [-1, -1]]  # [CLS] q p p p [SEP]
  features = {"example_index": [0], "offsets": [offsets]}
  examples = [{"id": "x", "context": context}]
  start = np.array([[0.0, 9.0, 1.0, 3.0, 0.0, 0.0]])  # the best start (9) is a question token: not allowed
  end = np.array([[0.0, 0.0, 0.0, 2.0, 1.0, 0.0]])
  assert task.decode((start, end), features, examples) == {"x": "beta"}
  assert task.decode((start, end), features, examples, max_answer_length=0) == {"x": ""}
  null = (np.array([[6.0, 9.0, 1.0, 3.0, 0.0, 0.0]]), end)  # null 6 + 0 = 6 > span 3 + 2 = 5
  assert task.decode(null, features, examples) == {"x": ""}
  assert task.decode(null, features, examples, null_score_threshold=1.5) == {"x": "beta"}
