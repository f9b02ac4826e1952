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
  gold = {
    "a": ["Denver Broncos", "The Broncos"],  # several gold answers: the best one counts
    "b": [],  # unanswerable
    "c": ["1990"],
    "d": [],
  }
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
  assert task.decode((start, end), features, examples)[0] == {"x": "beta"}
  assert task.decode((start, end), features, examples, max_answer_length=0)[0] == {"x": ""}
  null = (np.array([[6.0, 9.0, 1.0, 3.0, 0.0, 0.0]]), end)  # null 6 + 0 = 6 > span 3 + 2 = 5
  assert task.decode(null, features, examples)[0] == {"x": ""}
  assert task.decode(null, features, examples, null_score_threshold=1.5)[0] == {"x": "beta"}


def test_squad2_best_threshold_follows_the_official_evaluation():
  """The official script's find_best_thresh on a hand-worked case: answering questions in order of
  their null-score margin; has-answer ones add their score, no-answer ones cost 1 when answered."""
  from minilm_jax.tasks.squad import best_threshold_scores

  gold = {"q1": ["alpha"], "q2": ["beta gamma"], "q3": [], "q4": []}
  spans = {"q1": ("alpha", -2.0), "q2": ("beta", 0.5), "q3": ("delta", 1.0), "q4": ("epsilon", 3.0)}
  scores = best_threshold_scores(gold, spans)
  # exact: 2 (none answered) -> 3 (q1) -> 3 (q2 wrong) -> 2 -> 1; F1: 2 -> 3 -> 3 + 2/3 -> ...
  assert scores["best_exact"] == pytest.approx(75.0) and scores["best_exact_thresh"] == -2.0
  assert scores["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4) and scores["best_f1_thresh"] == 0.5


def test_mlqa_scores_per_language_on_hand_computed_examples():
  """MLQA's normalisation per language (its articles; Chinese split into characters) and the
  per-language and average exact match / F1."""
  from minilm_jax.tasks.squad import mlqa_normalize, mlqa_scores

  assert mlqa_normalize("der Hund", "de") == ["hund"] and mlqa_normalize("der Hund", "en") == ["der", "hund"]
  assert mlqa_normalize("北京市, abc", "zh") == ["北", "京", "市", "abc"]
  assert mlqa_normalize("«los Ángeles»", "es") == ["ángeles"]  # Unicode punctuation too
  rows = [
    ("a", "en", ["the Eiffel Tower"], "Eiffel Tower!"),  # exact 1, F1 1
    ("b", "en", ["Paris, France"], "France"),  # exact 0, F1 2/3
    ("c", "de", ["der Hund"], "Hund"),  # exact 1 (German article)
    ("d", "es", ["los Ángeles"], "Ángeles"),  # exact 1
    ("e", "zh", ["北京"], "北京市"),
  ]  # exact 0; F1: 2 of 3 characters, P 2/3, R 1 -> 0.8
  examples = [{"id": i, "language": l, "answer_texts": golds} for i, l, golds, _ in rows]
  scores = mlqa_scores(examples, {i: p for i, _, _, p in rows})
  assert scores["exact_en"] == pytest.approx(50) and scores["f1_en"] == pytest.approx(100 * (1 + 2 / 3) / 2)
  assert scores["exact_de"] == scores["exact_es"] == scores["f1_de"] == scores["f1_es"] == pytest.approx(100)
  assert scores["exact_zh"] == 0 and scores["f1_zh"] == pytest.approx(80)
  assert scores["exact"] == pytest.approx((50 + 100 + 100 + 0) / 4)
  assert scores["f1"] == pytest.approx((100 * (1 + 2 / 3) / 2 + 100 + 100 + 80) / 4)
