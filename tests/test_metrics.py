"""Task metrics and the SQuAD 2.0 metric on hand-checked examples."""

import numpy as np
import pytest

from minilm_jax.tasks import metrics
from minilm_jax.tasks.squad import SquadTask, exact_match, f1_score, normalize_answer, squad_v2_scores


def test_task_metrics_on_hand_computed_examples():
  """The metric names the tasks use, each on an example worked by hand (the values come from
  scikit-learn and scipy; these check that each name is wired to the right definition)."""
  y, p = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]  # tp 2, fp 1, fn 1, tn 2
  assert metrics.accuracy(y, p) == pytest.approx(4 / 6)
  assert metrics.f1(y, p) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))  # positive class 1 only
  assert metrics.matthews(y, p) == pytest.approx((2 * 2 - 1 * 1) / np.sqrt(3 * 3 * 3 * 3))
  y3, p3 = [0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 2, 0]  # per-class F1: 1/2, 4/5, 2/3
  assert metrics.macro_f1(y3, p3) == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)
  assert metrics.matthews([1, 1, 1], [1, 1, 1]) == 0.0 and metrics.f1([0, 0], [0, 0]) == 0.0  # degenerate: 0
  assert metrics.pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
  assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138)  # ties share rank 2.5
  assert np.isnan(metrics.pearson([1, 1, 1], [1, 2, 3]))  # a constant prediction has no correlation


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
