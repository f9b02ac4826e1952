"""Corpus packing and the resumable batch stream."""

import os
from functools import partial

import datasets
import ml_collections
import numpy as np
import pytest

from conftest import ROOT, WORDNET_SMALL, WORDNET_SMALL_TRAIN, load_config_module
from minilm_jax.data import demo_corpus, wordnet_db
from minilm_jax.data.corpus import BatchStream, MultiTaskStream, load_blocks, pack_blocks, pad_blocks, stack_columns
from minilm_jax.errors import UserError
from minilm_jax.tasks import get_task


def test_packing_respects_documents_and_lengths():
  rows = [[1, 2], [3, 4, 5], [], [6], [7, 8, 9, 10, 11, 12, 13], [14]]
  assert pack_blocks(rows, 5) == [[1, 2, 3, 4, 5], [6], [7, 8, 9, 10, 11], [12, 13, 14]]


def test_packing_starts_a_new_block_when_the_next_sentence_does_not_fit():
  assert pack_blocks([[1, 2, 3], [4, 5, 6]], 5) == [[1, 2, 3], [4, 5, 6]]


def _config(corpus, max_len=32):
  c = ml_collections.ConfigDict()
  c.corpus, c.corpus_config, c.text_column, c.max_seq_length, c.num_proc = corpus, "", "text", max_len, 1
  return c


def test_blocks_are_bert_inputs_of_real_text(tiny_corpus, minilm, tmp_path):
  *_, tokenizer = minilm
  blocks = load_blocks(_config(tiny_corpus), tokenizer, str(tmp_path))
  lengths = [len(b) for b in blocks["input_ids"]]
  assert max(lengths) <= 32 and np.mean(lengths) > 20  # packing fills blocks
  first = blocks[0]["input_ids"]
  assert first[0] == tokenizer.cls_token_id and first[-1] == tokenizer.sep_token_id
  text = tokenizer.decode(first[1:-1])
  assert text.split()[0].isalpha()


def test_a_corpus_read_again_finds_its_blocks_cached_unless_the_tokenizer_or_length_changed(
  tiny_corpus, minilm_dir, minilm, tmp_path
):
  """A corpus on disk is packed once per tokenizer and length: the same pair reads the blocks that
  `datasets` cached (the fingerprint hashed from the tokenizer's state, not by pickling it), and
  another tokenizer (here the same vocabulary and special tokens, cased) or length packs anew, as
  that tokenizer and length would alone."""
  import transformers

  *_, tokenizer = minilm
  first = load_blocks(_config(tiny_corpus), tokenizer, str(tmp_path))
  again = load_blocks(_config(tiny_corpus), tokenizer, str(tmp_path))
  assert again.cache_files == first.cache_files and again["input_ids"] == first["input_ids"]
  cased = transformers.BertTokenizerFast(os.path.join(minilm_dir, "vocab.txt"), do_lower_case=False)
  assert cased.cls_token_id == tokenizer.cls_token_id and cased.sep_token_id == tokenizer.sep_token_id
  theirs = load_blocks(_config(tiny_corpus), cased, str(tmp_path))
  assert theirs.cache_files != first.cache_files and theirs["input_ids"] != first["input_ids"]
  first_sentence = datasets.load_dataset("text", data_files=[tiny_corpus], split="train")[0]["text"]
  expected = cased(first_sentence, add_special_tokens=False)["input_ids"]
  assert theirs[0]["input_ids"][1 : 1 + len(expected)] == expected  # the cased tokenizer's pieces
  shorter = load_blocks(_config(tiny_corpus, max_len=19), tokenizer, str(tmp_path))
  assert shorter.cache_files != first.cache_files and max(len(b) for b in shorter["input_ids"]) <= 19


def test_json_corpus_with_another_column(minilm, tmp_path):
  *_, tokenizer = minilm
  path = tmp_path / "c.jsonl"
  path.write_text('{"body": "One sentence of text."}\n{"body": "Another sentence follows it."}\n')
  config = _config(str(path))
  with pytest.raises(UserError, match="has no column 'text'"):
    load_blocks(config, tokenizer, str(tmp_path))
  config.text_column = "body"
  # Each JSON row is a document: two blocks, though both would fit in one.
  assert len(load_blocks(config, tokenizer, str(tmp_path))) == 2
  config.rows = "lines"  # rows of one document
  assert len(load_blocks(config, tokenizer, str(tmp_path))) == 1
  config.rows = "paragraphs"
  with pytest.raises(UserError, match="data.rows='paragraphs': choose one of auto, lines, documents"):
    load_blocks(config, tokenizer, str(tmp_path))


def test_documents_are_packed_by_whole_sentences_and_kept_apart(minilm, tmp_path):
  """A corpus of whole documents (as the hub's Wikipedia): blocks end at sentence ends, none holds
  two documents, and every sentence is in a block once, in order."""
  *_, tokenizer = minilm
  first = ["The cat sat on the mat.", "It was a warm day in May.", "Nobody asked why!"]
  second = ["A second document starts here.", "It is short."]
  path = tmp_path / "docs.parquet"
  datasets.Dataset.from_dict({"text": [" ".join(first), " ".join(second)]}).to_parquet(str(path))
  blocks = load_blocks(_config(str(path), max_len=19), tokenizer, str(tmp_path))["input_ids"]
  ids = lambda sentence: tokenizer(sentence, add_special_tokens=False)["input_ids"]
  cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
  # Whole sentences, greedily, up to 17 tokens between [CLS] and [SEP]: as BERT's blocks of a document.
  expected = [ids(first[0]) + ids(first[1]), ids(first[2]), ids(second[0]) + ids(second[1])]
  assert [len(e) for e in expected] == [15, 4, 10]  # the first two sentences fit, the third does not
  assert blocks == [[cls] + e + [sep] for e in expected]


def test_the_wordnet_corpus_is_the_excerpts_training_text_one_text_a_block(minilm, tmp_path):
  """`data.corpus="wordnet"` (the demo's): every training synset's definition and examples, each its
  own block, and nothing of the dev split the demo's evaluators score, except texts WordNet repeats
  word for word in a training synset (three definitions, such as "coral snakes")."""
  *_, tokenizer = minilm
  blocks = load_blocks(_config("wordnet", max_len=64), tokenizer, str(tmp_path))["input_ids"]
  synsets = wordnet_db.read_synsets(wordnet_db.EXCERPT_DIR)
  texts = {
    split: [t for s in synsets if wordnet_db.split_of(s.offset) == split for t in (s.definition, *s.examples)]
    for split in ("train", "dev")
  }
  ids = tokenizer(texts["train"], add_special_tokens=False)["input_ids"]
  pieces = [i[start : start + 62] for i in ids for start in range(0, len(i), 62)]  # a long text fills blocks
  assert blocks == [[tokenizer.cls_token_id] + p + [tokenizer.sep_token_id] for p in pieces]
  assert len(texts["train"]) == 4834 and len(set(texts["dev"]) & set(texts["train"])) == 3


def test_the_wordnet_excerpts_hold_the_tasks_splits_and_the_small_one_is_cut_from_the_full_one():
  """The package's excerpt gives both WordNet tasks their full splits (2,000 training and 1,000 dev
  examples); the tests' small one is what `make_excerpt.py --small` cuts from it (so it can be made
  again), with the training sizes the tests assert and every class in each split."""
  for name in WORDNET_SMALL_TRAIN:
    task = get_task(name)
    assert [len(task.load(split, wordnet_db.EXCERPT_DIR)) for split in ("train", "dev")] == [2000, 1000]
    for split in ("train", "dev"):
      labels = task.load(split, WORDNET_SMALL)["label"]
      assert len(set(labels)) == len(task.labels) and (split == "dev" or len(labels) == WORDNET_SMALL_TRAIN[name])
  path = os.path.join(ROOT, "tests", "data", "wordnet", "make_excerpt.py")
  make_excerpt = load_config_module(path)
  cut = make_excerpt.select(wordnet_db.read_synsets(wordnet_db.EXCERPT_DIR), **make_excerpt.SMALL)
  assert cut == {s.offset for s in wordnet_db.read_synsets(WORDNET_SMALL)}


def _stream(n=100, batch=8, seed=3, process_index=0, process_count=1):
  blocks = datasets.Dataset.from_dict({"input_ids": [[101, i, 102] for i in range(n)]})
  return BatchStream(blocks, batch, seed, partial(pad_blocks, seq_len=6, pad_id=0), process_index, process_count)


def test_stream_is_a_function_of_seed_and_batch_index():
  a, b = _stream(), _stream()
  later_first = [b.batch(i)["input_ids"] for i in (30, 2)]  # random access, any order
  np.testing.assert_array_equal(a.batch(2)["input_ids"], later_first[1])
  np.testing.assert_array_equal(a.batch(30)["input_ids"], later_first[0])
  assert not np.array_equal(_stream(seed=4).batch(2)["input_ids"], a.batch(2)["input_ids"])


def test_each_epoch_visits_every_full_batch_of_blocks_once():
  s = _stream()
  seen = np.concatenate([s.batch(i)["input_ids"][:, 1] for i in range(s.batches_per_epoch)])
  assert len(set(seen)) == len(seen) == 96
  next_epoch = np.concatenate([s.batch(i)["input_ids"][:, 1] for i in range(12, 24)])
  assert not np.array_equal(next_epoch, seen)  # reshuffled


def test_processes_read_disjoint_slices_of_the_global_batch():
  whole = _stream(batch=8).batch(5)["input_ids"]
  parts = [_stream(batch=8, process_index=p, process_count=2).batch(5)["input_ids"] for p in range(2)]
  np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_padding_and_mask():
  b = _stream().batch(0)
  assert b["input_ids"].shape == (8, 6) and b["attention_mask"][:, :3].all() and not b["attention_mask"][:, 3:].any()


def test_multi_task_stream_merges_and_shuffles_every_tasks_batches_each_epoch():
  def stream(task, n):
    rows = datasets.Dataset.from_dict({"attention_mask": [[1]] * n, "row": [f"{task}{i}" for i in range(n)]})
    return BatchStream(rows, 4, 0, stack_columns, name=task)

  make = lambda: MultiTaskStream({"a": stream("a", 12), "b": stream("b", 21)}, seed=3)  # 3 and 5 batches an epoch
  tasks = make()
  assert tasks.batches_per_epoch == 8
  for epoch in range(2):
    batches = [tasks.batch(epoch * 8 + i) for i in range(8)]
    assert sorted(b["task"] for b in batches) == ["a"] * 3 + ["b"] * 5
    for b in batches:
      assert all(r.startswith(b["task"]) for r in b["row"])  # a batch is one task's
    seen = [r for b in batches if b["task"] == "a" for r in b["row"]]
    assert sorted(seen) == sorted(f"a{i}" for i in range(12))  # each epoch, each row of a once
  orders = [[tasks.batch(e * 8 + i)["task"] for i in range(8)] for e in range(3)]
  assert len({tuple(o) for o in orders}) > 1  # shuffled anew each epoch
  resumed = make()  # a fresh stream (a restarted run) gives batch 13 without replaying 0-12
  assert list(resumed.batch(13)["row"]) == list(tasks.batch(13)["row"])


@pytest.mark.slow
def test_the_demo_corpus_is_harvested_once_per_machine_and_copied(tmp_path, monkeypatch):
  """Every run directory gets the same corpus; the standard library is parsed for the first only,
  and a cache folder that cannot be written only means harvesting into the run's own file."""
  harvests, harvested = [], {}
  harvest = demo_corpus._stdlib_documents

  def counted(stdlib):  # each harvest counted; the same harvest parsed once (3 s of the test's 9)
    harvests.append(stdlib)
    key = (stdlib, demo_corpus._sentences)
    harvested[key] = harvested[key] if key in harvested else harvest(stdlib)
    return harvested[key]

  monkeypatch.setattr(demo_corpus, "_stdlib_documents", counted)
  monkeypatch.setenv("MINILM_JAX_CACHE", str(tmp_path / "shared"))
  first = open(demo_corpus.write_demo_corpus(str(tmp_path / "a" / "demo_corpus.txt"))).read()
  second = open(demo_corpus.write_demo_corpus(str(tmp_path / "b" / "demo_corpus.txt"))).read()
  assert len(harvests) == 1 and first == second and len(first.split("\n\n")) > 500
  (tmp_path / "not_a_folder").write_text("")
  monkeypatch.setenv("MINILM_JAX_CACHE", str(tmp_path / "not_a_folder"))
  third = open(demo_corpus.write_demo_corpus(str(tmp_path / "c" / "demo_corpus.txt"))).read()
  assert len(harvests) == 2 and third == first
  # A version of the package that harvests otherwise (here: the first sentence of each paragraph)
  # harvests anew rather than copying the corpus the shared folder holds.
  monkeypatch.setenv("MINILM_JAX_CACHE", str(tmp_path / "shared"))
  sentences = demo_corpus._sentences
  monkeypatch.setattr(demo_corpus, "_sentences", lambda doc: list(sentences(doc))[:1])
  fourth = open(demo_corpus.write_demo_corpus(str(tmp_path / "d" / "demo_corpus.txt"))).read()
  assert len(harvests) == 3 and len(fourth) < len(first)
  assert len(os.listdir(tmp_path / "shared")) == 2  # each version's harvest
