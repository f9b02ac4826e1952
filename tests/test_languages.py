"""A corpus in several languages (`data.languages`, data/languages.py): XLM-R's sampling rule over
many blocks, no block of two languages, a stream that is a function of (seed, batch) and resumes,
held-out blocks from every language, the prepared corpus the same as tokenising on the fly, and a
distillation run on it; the settings that contradict each other refused in one line."""

import json
import os
import unicodedata

import numpy as np
import pytest

from conftest import ROOT, run_in_process, tiny_config
from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, split_heldout
from minilm_jax.data.languages import LanguageBlocks, language_corpora, language_spans, sampling_probabilities
from minilm_jax.data.prepared import corpus_blocks
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.evaluation.evaluators import evaluator

pytestmark = pytest.mark.xdist_group("languages")

# Documents per language: unequal, so that alpha visibly reshapes the shares. Each script's letters
# are its own (the tokenizer lower-cases and strips accents, keeping the script).
SENTENCES = {
  "en": ("The old cat sat on the warm mat.", "A dog ran across the green field."),
  "ru": ("Старый кот сидел на тёплом ковре.", "Собака бежала через зелёное поле."),
  "el": ("Η γάτα κάθεται στο χαλί.", "Ο σκύλος τρέχει στο χωράφι."),
}
DOCUMENTS = {"en": 240, "ru": 60, "el": 12}
SCRIPTS = {"en": "LATIN", "ru": "CYRILLIC", "el": "GREEK"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """One text file per language, `{lang}.txt`: documents of two sentences, a blank line after each."""
  root = tmp_path_factory.mktemp("languages")
  for code, count in DOCUMENTS.items():
    first, second = SENTENCES[code]
    (root / f"{code}.txt").write_text("".join(f"{first}\n{second} {i}\n\n" for i in range(count)))
  return str(root / "{lang}.txt")


def _config(tiny_teacher, corpus, **overrides):
  # Blocks of 64 tokens: the test vocabulary spells Russian and Greek words letter by letter, and a
  # sentence longer than a block would be cut into a block of digits alone.
  return tiny_config(tiny_teacher, corpus, **{"data.languages": "en,ru,el", "data.max_seq_length": 64, **overrides})


def _script(tokenizer, ids) -> set:
  """The scripts of a block's letters (its digits, punctuation and special tokens have none)."""
  text = tokenizer.decode([i for i in ids if i not in tokenizer.all_special_ids])
  return {unicodedata.name(ch).split()[0] for ch in text if ch.isalpha()}


@pytest.fixture(scope="module")
def blocks(tiny_teacher, corpus, tmp_path_factory):
  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  loaded, collate, _ = corpus_blocks(
    _config(tiny_teacher, corpus).data, tokenizer, str(tmp_path_factory.mktemp("cache"))
  )
  return loaded, collate, tokenizer


def test_each_language_is_packed_alone_and_in_its_own_rows(blocks):
  loaded, _, tokenizer = blocks
  assert isinstance(loaded, LanguageBlocks) and loaded.languages == ["en", "ru", "el"]
  assert len(loaded) == sum(loaded.counts) and all(n >= DOCUMENTS[c] for c, n in zip(loaded.languages, loaded.counts))
  first = 0
  for code, count in zip(loaded.languages, loaded.counts):
    rows = loaded[np.arange(first, first + count)]["input_ids"]
    assert all(_script(tokenizer, ids) == {SCRIPTS[code]} for ids in rows), code
    first += count


def test_languages_are_sampled_by_xlm_rs_rule_over_many_blocks(blocks):
  """Through the batch stream, as training reads it: each row's language told by its script.
  q_i = (n_i / N)^0.3 / sum_j (n_j / N)^0.3, written out here from the block counts."""
  loaded, collate, tokenizer = blocks
  n = loaded.counts.astype(float)
  expected = (n / n.sum()) ** 0.3 / ((n / n.sum()) ** 0.3).sum()
  np.testing.assert_allclose(loaded.probabilities(), expected, rtol=1e-12)
  assert expected[2] > n[2] / n.sum() * 2  # the smallest language is read far above its share
  stream = BatchStream(loaded, 8, 5, collate)
  seen = {code: 0 for code in SCRIPTS}
  by_script = {script: code for code, script in SCRIPTS.items()}
  batches = 3 * stream.batches_per_epoch  # three epochs: ~1,000 rows
  for b in range(batches):
    for ids in stream.batch(b)["input_ids"]:
      (script,) = _script(tokenizer, ids)
      seen[by_script[script]] += 1
  total = batches * 8
  shares = np.array([seen[c] for c in loaded.languages]) / total
  # Four standard deviations of a share estimated from `total` independent draws.
  tolerance = 4 * np.sqrt(expected * (1 - expected) / total)
  assert np.all(np.abs(shares - expected) < tolerance), (shares, expected)
  # Over many epochs' orders (the draws alone), the shares are within 1.5 points.
  draws = np.concatenate([loaded.epoch_order(5, epoch) for epoch in range(40)])
  language = np.searchsorted(np.cumsum(loaded.counts), draws, side="right")
  np.testing.assert_allclose(np.bincount(language) / len(draws), expected, atol=0.015)
  one = LanguageBlocks(loaded.rows, loaded.spans, 1.0)  # alpha 1: the corpus's own shares
  np.testing.assert_allclose(one.probabilities(), n / n.sum(), rtol=1e-12)


def test_the_stream_is_a_function_of_seed_and_batch_and_reads_every_block(blocks):
  loaded, collate, _ = blocks
  straight = BatchStream(loaded, 8, 1, collate)
  order = [straight.batch(b)["input_ids"] for b in range(2 * straight.batches_per_epoch)]
  resumed = BatchStream(loaded, 8, 1, collate)  # a restart reading from the middle of epoch 1
  for b in (straight.batches_per_epoch + 3, 4, 2 * straight.batches_per_epoch - 1):
    np.testing.assert_array_equal(resumed.batch(b)["input_ids"], order[b])
  assert not np.array_equal(BatchStream(loaded, 8, 2, collate).batch(0)["input_ids"], order[0])
  # A language read more often than it has blocks reads all of them before any twice.
  epoch = loaded.epoch_order(1, 0)
  greek = epoch[epoch >= loaded.counts[:2].sum()]
  assert len(greek) > loaded.counts[2]
  assert sorted(greek[: loaded.counts[2]]) == list(range(loaded.counts[:2].sum(), len(loaded)))


def test_held_out_blocks_are_every_languages_last_in_their_shares():
  rows = np.arange(100)
  loaded = LanguageBlocks(rows, language_spans({"en": 70, "ru": 20, "el": 10}), 0.3)
  train, heldout = split_heldout(loaded, 10, 4)
  assert list(train.counts) == [63, 18, 9] and list(heldout.counts) == [7, 2, 1]
  held = heldout[np.arange(len(heldout))]
  np.testing.assert_array_equal(held, [63, 64, 65, 66, 67, 68, 69, 88, 89, 99])
  assert not set(held) & set(train[np.arange(len(train))])
  np.testing.assert_allclose(heldout.probabilities(), [0.7, 0.2, 0.1])
  assert list(sampling_probabilities([5, 0], 0.3)) == [1.0, 0.0]


@pytest.mark.slow
def test_a_prepared_multilingual_corpus_reads_the_same_batches_and_trains(
  blocks, tiny_teacher, corpus, tmp_path, monkeypatch, capfd
):
  """`prepare_data` over the languages (the program, as the docs run it), the same rows and batches
  as tokenising on the fly; a run on it with held-out blocks from every language."""
  loaded, collate, _ = blocks
  out = str(tmp_path / "prepared")
  monkeypatch.setenv("TINY_TEACHER", tiny_teacher)  # tests/tiny_config.py's teacher and corpus
  monkeypatch.setenv("TINY_CORPUS", corpus)
  config_file = os.path.join(ROOT, "tests", "tiny_config.py")
  overrides = ["--config.data.languages=en,ru,el", "--config.data.max_seq_length=64"]  # as `_config`
  proc = run_in_process("prepare_data", "--config", config_file, "--out", out, *overrides, capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-2000:]
  manifest = json.load(open(os.path.join(out, "manifest.json")))
  assert manifest["languages"] == dict(zip(loaded.languages, map(int, loaded.counts)))
  config = _config(tiny_teacher, corpus, **{"data.prepared": out})
  ready, ready_collate, _ = corpus_blocks(config.data, runs.load_tokenizer_of(tiny_teacher), str(tmp_path))
  for b in (0, 7, 40):
    np.testing.assert_array_equal(
      BatchStream(ready, 8, 0, ready_collate).batch(b)["input_ids"],
      BatchStream(loaded, 8, 0, collate).batch(b)["input_ids"],
    )
  config.data.languages = "en,ru"
  with pytest.raises(UserError, match=r"holds the languages \[en,ru,el\] and data.languages is \[en,ru\]"):
    corpus_blocks(config.data, runs.load_tokenizer_of(tiny_teacher), str(tmp_path))

  run = _config(tiny_teacher, corpus, num_steps=2, **{"data.prepared": out, "data.heldout_blocks": 8})
  run.evaluators.heldout = evaluator("heldout", 2)
  distillation = build_distillation(run, str(tmp_path / "run"))
  # 8 blocks held out, each language within one block of its share of them.
  spans = distillation.record().heldout["spans"]
  held = {code: sum(stop - start for start, stop in spans.get(code, ())) for code in loaded.languages}
  share = 8 * loaded.counts / loaded.counts.sum()
  assert sum(held.values()) == 8 and np.all(np.abs(np.array(list(held.values())) - share) < 1), (held, share)
  distillation.run()
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert [r["step"] for r in rows if "eval/heldout/loss" in r] == [0, 2]
  assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"data.languages": ""}, r"data.corpus='.*\{lang\}.txt' has \{lang\} but data.languages is empty"),
    ({"data.corpus": "plain.txt"}, r"data.languages=en,ru,el needs \{lang\} in data.corpus or data.corpus_config"),
    ({"data.languages": "en,ru,en"}, "data.languages lists en more than once"),
    ({"data.language_alpha": 0.0}, "data.language_alpha=0.0 must be above 0"),
    ({"data.languages": "en,fr"}, r"corpus file .*fr.txt does not exist: fix data.corpus"),
  ],
)
def test_contradicting_language_settings_are_one_line(tiny_teacher, corpus, tmp_path, overrides, message):
  with pytest.raises(UserError, match=message):
    build_distillation(_config(tiny_teacher, corpus, **overrides), str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_language_corpora_fill_in_each_code():
  config = _config("teacher", "{lang}.txt").data
  config.corpus, config.corpus_config = "wikimedia/wikipedia", "20231101.{lang}"
  corpora = language_corpora(config)
  assert [(code, one.corpus, one.corpus_config) for code, one in corpora] == [
    ("en", "wikimedia/wikipedia", "20231101.en"),
    ("ru", "wikimedia/wikipedia", "20231101.ru"),
    ("el", "wikimedia/wikipedia", "20231101.el"),
  ]
