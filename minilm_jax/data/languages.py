"""A corpus in several languages, mixed as XLM-R mixes CC-100 (Conneau et al. 2020, section 3.1):
language i is sampled with probability q_i = p_i^alpha / sum_j p_j^alpha, where p_i = n_i / N is
its share of the corpus's blocks, so that alpha < 1 (XLM-R: 0.3) raises the small languages and
lowers the large ones; alpha = 1 reads every language in its share.

`data.languages` lists the language codes and `{lang}` in `data.corpus` or `data.corpus_config`
stands for each, so one corpus is read per language: a hub dataset's per-language subsets
(`wikimedia/wikipedia` with `20231101.{lang}`) or local files (`corpus/{lang}.txt`). Each
language is tokenised and packed on its own, so no block holds two languages (nor two documents,
as in one language); the blocks of all languages are concatenated in the order listed, and
`LanguageBlocks` keeps each language's rows.

An epoch is as many draws as the corpus has blocks: a language per draw from q (a fixed function of
the seed and the epoch), and a language's draws read its blocks in a fresh permutation per pass (a
language sampled more often than it has blocks is read again, in another order). Global batch b is
therefore still a fixed function of (seed, b), as `corpus.BatchStream` needs to resume anywhere.
"""

import datasets
import ml_collections
import numpy as np

from minilm_jax.data.corpus import first_sentences, load_blocks
from minilm_jax.errors import UserError

PLACEHOLDER = "{lang}"


def language_list(data_config) -> list:
  """The language codes of `data.languages` ([] for a corpus in one language), checked against the
  `{lang}` placeholder and `data.language_alpha`."""
  languages = [code.strip() for code in data_config.get("languages", "").split(",") if code.strip()]
  places = [f for f in ("corpus", "corpus_config") if PLACEHOLDER in data_config.get(f, "")]
  if not languages:
    if places:
      raise UserError(
        f"data.{places[0]}={data_config[places[0]]!r} has {PLACEHOLDER} but data.languages is empty: "
        f"list the languages (data.languages=en,fr,...) or name one corpus"
      )
    return []
  if not places:
    raise UserError(
      f"data.languages={data_config.languages} needs {PLACEHOLDER} in data.corpus or data.corpus_config, "
      f"where each language's code goes (data.corpus_config=20231101.{PLACEHOLDER}, data.corpus=text/{PLACEHOLDER}.txt)"
    )
  repeated = sorted({code for code in languages if languages.count(code) > 1})
  if repeated:
    raise UserError(f"data.languages lists {', '.join(repeated)} more than once: list each language once")
  alpha = data_config.get("language_alpha", 0.3)
  if not alpha > 0:
    raise UserError(
      f"data.language_alpha={alpha} must be above 0: XLM-R's 0.3 raises small languages, 1 keeps the corpus's shares"
    )
  return languages


def language_corpora(data_config) -> list:
  """[(language code, the data config of that language's corpus)]: one entry with code "" for a
  corpus in one language, else one per listed language with `{lang}` filled in."""
  languages = language_list(data_config)
  if not languages:
    return [("", data_config)]
  corpora = []
  for code in languages:
    one = ml_collections.ConfigDict(data_config.to_dict())
    one.corpus = data_config.corpus.replace(PLACEHOLDER, code)
    one.corpus_config = data_config.corpus_config.replace(PLACEHOLDER, code)
    one.languages = ""
    corpora.append((code, one))
  return corpora


def sampling_probabilities(counts, alpha: float) -> np.ndarray:
  """XLM-R's q_i = p_i^alpha / sum_j p_j^alpha with p_i = n_i / N (alpha > 0: a language with no
  blocks gets 0)."""
  shares = np.asarray(counts, np.float64) / np.sum(counts)
  return shares**alpha / np.sum(shares**alpha)


class LanguageBlocks:
  """Blocks of several languages: `rows` (any blocks indexed by arrays: a `datasets.Dataset`, a
  prepared corpus) with each language's blocks in the ranges `spans[code] = [(start, stop), ...]`
  of them. Indexed 0..len-1 language after language, as `BatchStream` indexes rows, and read in
  the order `epoch_order` samples."""

  def __init__(self, rows, spans: dict, alpha: float):
    self.rows, self.spans, self.alpha = rows, spans, alpha
    self.counts = np.array([sum(stop - start for start, stop in ranges) for ranges in spans.values()], np.int64)
    for code, count in zip(spans, self.counts):
      if count == 0:
        raise UserError(
          f"the corpus of language {code!r} gives no blocks: fix its data or leave it out of data.languages"
        )
    ranges = [r for language in spans.values() for r in language]
    self._starts = np.array([start for start, _ in ranges], np.int64)
    self._offsets = np.cumsum([0] + [stop - start for start, stop in ranges])
    self._first = np.cumsum([0, *self.counts])  # the first local index of each language

  @property
  def languages(self) -> list:
    return list(self.spans)

  def __len__(self) -> int:
    return int(self._offsets[-1])

  def __getitem__(self, indices):
    indices = np.asarray(indices)
    span = np.searchsorted(self._offsets, indices, side="right") - 1
    return self.rows[self._starts[span] + indices - self._offsets[span]]

  def probabilities(self) -> np.ndarray:
    return sampling_probabilities(self.counts, self.alpha)

  def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
    """The local row indices the draws of `epoch` read, len(self) of them."""
    draws = np.random.default_rng([seed, epoch]).choice(len(self.counts), size=len(self), p=self.probabilities())
    order = np.empty(len(self), np.int64)
    for i, count in enumerate(self.counts):
      where = np.flatnonzero(draws == i)
      language = np.random.default_rng([seed, epoch, i])
      passes = -(-len(where) // int(count))
      reads = np.concatenate([language.permutation(int(count)) for _ in range(passes)] or [np.arange(0)])
      order[where] = self._first[i] + reads[: len(where)]
    return order

  def split_tail(self, count: int):
    """(the training blocks, the held-out blocks): `count` blocks held out from the languages' ends,
    each language giving its share of them (largest remainders), so the held-out loss reads every
    language as the corpus holds it. The held-out blocks are read in their shares (alpha 1)."""
    shares = count * self.counts / self.counts.sum()
    taken = np.floor(shares).astype(np.int64)
    taken[np.argsort(taken - shares)[: count - int(taken.sum())]] += 1
    train, heldout = {}, {}
    for (code, ranges), k in zip(self.spans.items(), taken):
      train[code], heldout[code] = _cut_tail(ranges, int(k))
    heldout = {code: ranges for code, ranges in heldout.items() if ranges}
    return LanguageBlocks(self.rows, train, self.alpha), LanguageBlocks(self.rows, heldout, 1.0)


def _cut_tail(ranges: list, k: int):
  """(ranges less their last k rows, those k rows as ranges)."""
  kept, tail = list(ranges), list[tuple]()
  while k:
    start, stop = kept.pop()
    cut = min(k, stop - start)
    tail.insert(0, (stop - cut, stop))
    if stop - cut > start:
      kept.append((start, stop - cut))
    k -= cut
  return kept, tail


def language_spans(counts: dict) -> dict:
  """{code: [(start, stop)]} of languages whose blocks follow one another in the order of `counts`."""
  bounds = np.cumsum([0, *counts.values()])
  return {code: [(int(bounds[i]), int(bounds[i + 1]))] for i, code in enumerate(counts)}


def load_corpus(data_config, tokenizer, cache_dir: str):
  """The corpus's packed blocks (`corpus.load_blocks`): one dataset, or with `data.languages` each
  language's blocks concatenated in `LanguageBlocks`."""
  corpora = language_corpora(data_config)
  if len(corpora) == 1 and not corpora[0][0]:
    return load_blocks(data_config, tokenizer, cache_dir)
  parts = {code: load_blocks(one, tokenizer, cache_dir) for code, one in corpora}
  rows = datasets.concatenate_datasets(list(parts.values()))
  return LanguageBlocks(
    rows, language_spans({code: len(part) for code, part in parts.items()}), data_config.language_alpha
  )


def corpus_first_sentences(data_config, cache_dir: str, n: int) -> list:
  """The corpus's first `n` sentences (`corpus.first_sentences`, ETD-Impt's scoring text); in
  several languages, an equal share from the start of each."""
  corpora = language_corpora(data_config)
  share = -(-n // len(corpora))
  return [s for _, one in corpora for s in first_sentences(one, cache_dir, share)][:n]
