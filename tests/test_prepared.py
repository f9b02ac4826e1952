"""Prepared corpora (`python -m minilm_jax.prepare_data`): the same blocks and batches as
tokenising on the fly, each process's disjoint share of every global batch, resume from a
prepared corpus, and a mismatched or missing one refused in one line."""

import hashlib
import json
import os
import subprocess
import sys

import datasets
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from conftest import (
  DAMAGE,
  ROOT,
  TEST_UMASK,
  damage_settings,
  damaged_bytes,
  modes_not_from_the_umask,
  read_metrics,
  tiny_config,
)
from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream
from minilm_jax.data.prepared import PreparedBlocks, corpus_blocks
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError

# Its module fixture is built once: every test of this module runs on the same xdist worker.
pytestmark = pytest.mark.xdist_group("prepared")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_teacher, tiny_corpus):
  """The tiny corpus prepared at length 32 in 3 shards, through the program."""
  out = str(tmp_path_factory.mktemp("prepared") / "corpus")
  env = dict(os.environ, TINY_TEACHER=tiny_teacher, TINY_CORPUS=tiny_corpus, PYTHONPATH=os.path.join(ROOT, "tests"))
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "minilm_jax.prepare_data",
      "--config",
      os.path.join(ROOT, "tests", "tiny_config.py"),
      "--out",
      out,
      "--shards",
      "3",
    ],
    env=env,
    capture_output=True,
    text=True,
    cwd=ROOT,
    umask=TEST_UMASK,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not modes_not_from_the_umask(out)
  again = subprocess.run(proc.args, env=env, capture_output=True, text=True, cwd=ROOT)  # never over a prepared one
  line = again.stderr.strip()
  assert again.returncode == 2 and "\n" not in line and f"--out {out} already holds 8 files" in line, line
  assert "--overwrite" in line
  return out


@pytest.mark.slow
def test_prepared_blocks_and_batches_equal_the_on_the_fly_ones(prepared, tiny_teacher, tiny_corpus, tmp_path):
  config = tiny_config(tiny_teacher, tiny_corpus)
  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  blocks, collate, _ = corpus_blocks(config.data, tokenizer, str(tmp_path))
  config.data.prepared = prepared
  ready, ready_collate, _ = corpus_blocks(config.data, tokenizer, str(tmp_path))
  manifest = json.load(open(os.path.join(prepared, "manifest.json")))
  assert len(ready) == len(blocks) == manifest["blocks"] and len(manifest["shards"]) == 3
  assert manifest["tokens"] == sum(len(b) for b in blocks["input_ids"])
  for b in (0, 5, len(blocks) // 8 + 1):  # the last crosses into the second epoch's permutation
    a = BatchStream(blocks, 8, 3, collate).batch(b)
    p = BatchStream(ready, 8, 3, ready_collate).batch(b)
    for k in ("input_ids", "attention_mask", "token_type_ids"):
      np.testing.assert_array_equal(p[k], a[k])


def test_two_processes_read_disjoint_rows_that_make_up_the_global_batch(prepared, tiny_teacher):
  ready = PreparedBlocks(prepared, runs.load_tokenizer_of(tiny_teacher), 32, "")
  whole = BatchStream(ready, 16, 0, lambda rows: rows)
  parts = [BatchStream(ready, 16, 0, lambda rows: rows, process_index=i, process_count=2) for i in (0, 1)]
  for b in range(4):
    mine = [p.indices(b) for p in parts]
    assert not set(mine[0]) & set(mine[1])
    np.testing.assert_array_equal(np.concatenate(mine), whole.indices(b))
    np.testing.assert_array_equal(np.concatenate([p.batch(b)["input_ids"] for p in parts]), whole.batch(b)["input_ids"])


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_stream_from_a_prepared_corpus(prepared, tiny_teacher, tiny_corpus, tmp_path):
  straight = tiny_config(tiny_teacher, tiny_corpus, num_steps=4, **{"data.prepared": prepared})
  build_distillation(straight, str(tmp_path / "straight")).run()
  build_distillation(
    tiny_config(tiny_teacher, tiny_corpus, num_steps=2, **{"data.prepared": prepared}), str(tmp_path / "resumed")
  ).run()
  build_distillation(straight, str(tmp_path / "resumed")).run()
  assert [m["loss"] for m in read_metrics(str(tmp_path / "resumed"))] == [
    m["loss"] for m in read_metrics(str(tmp_path / "straight"))
  ]


def _prepared_anew(directory: str, rows_of):
  """Shard 0 of the corpus at `directory` rewritten in place with its rows reordered by `rows_of`
  (other blocks, the same count and sizes). Returns the manifest as it was and the new shard's
  sha256: written into it, the corpus is as `prepare_data --overwrite` would leave it; left out, a
  shard changed after the corpus was prepared."""
  manifest = json.load(open(os.path.join(directory, "manifest.json")))
  shard = manifest["shards"][0]
  ids = np.load(os.path.join(directory, shard["blocks"]))
  lengths = np.load(os.path.join(directory, shard["lengths"]))
  ids, lengths = ids[rows_of(len(ids))], lengths[rows_of(len(ids))]
  np.save(os.path.join(directory, shard["blocks"]), ids)
  np.save(os.path.join(directory, shard["lengths"]), lengths)
  digest = hashlib.sha256(np.ascontiguousarray(ids).data)
  digest.update(np.ascontiguousarray(lengths).data)
  return manifest, digest.hexdigest()


def test_a_shard_changed_after_its_corpus_was_prepared_is_one_line(prepared, tiny_teacher, tmp_path):
  """Two blocks of a shard swapped in place, at the same size: its bytes differ from the sha256 its
  manifest holds (read without a word before). A shard verified once is not read again while the
  file system says it is unchanged; a change after that verification is still found."""
  import shutil

  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  copy, cache = str(tmp_path / "corpus"), str(tmp_path / "cache")
  shutil.copytree(prepared, copy)
  PreparedBlocks(copy, tokenizer, 32, cache)  # verified, and recorded as verified in `cache`
  assert len(json.load(open(os.path.join(cache, "prepared_verified.json")))) == 3
  manifest, _ = _prepared_anew(copy, lambda n: [1, 0, *range(2, n)])
  shard = manifest["shards"][0]
  message = f"{shard['blocks']} \\(with {shard['lengths']}\\) holds other blocks than {copy}/manifest.json says"
  for cache_dir in (cache, str(tmp_path / "fresh"), ""):
    with pytest.raises(UserError, match=message):
      PreparedBlocks(copy, tokenizer, 32, cache_dir)


@pytest.mark.slow
def test_a_run_resumed_on_a_corpus_prepared_anew_is_refused(prepared, tiny_teacher, tiny_corpus, tmp_path):
  """A distillation stopped, its corpus prepared anew at its path (other blocks, the same count and
  sizes), the same command: one line naming data.prepared, before any checkpoint is touched (it
  resumed on the new blocks without a word); likewise a corpus file rewritten under a run that
  tokenises it."""
  import shutil

  copy, workdir = str(tmp_path / "corpus"), str(tmp_path / "run")
  shutil.copytree(prepared, copy)
  config = tiny_config(tiny_teacher, tiny_corpus, num_steps=2, **{"data.prepared": copy})
  build_distillation(config, workdir).run()
  assert runs.read_record(workdir).inputs.keys() == {"data.prepared"}
  manifest, digest = _prepared_anew(copy, lambda n: list(range(n))[::-1])
  manifest["shards"][0]["sha256"] = digest
  (tmp_path / "corpus" / "manifest.json").write_text(json.dumps(manifest))
  checkpoints = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  with pytest.raises(UserError, match=f"data.prepared={copy} holds other content than {workdir} started with"):
    build_distillation(config, workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == checkpoints
  # A corpus of local files tokenised by the run: its files' bytes are its identity.
  corpus, workdir = str(tmp_path / "corpus.txt"), str(tmp_path / "on_the_fly")
  shutil.copy(tiny_corpus, corpus)
  config = tiny_config(tiny_teacher, corpus, num_steps=2)
  build_distillation(config, workdir).run()
  assert runs.read_record(workdir).inputs.keys() == {"data.corpus"}
  moved = str(tmp_path / "elsewhere.txt")  # the same bytes at another path: the run goes on
  shutil.copy(corpus, moved)
  build_distillation(tiny_config(tiny_teacher, moved, num_steps=2), workdir).run()
  with open(corpus, "a", encoding="utf-8") as f:
    f.write("A sentence written after the run began.\n")
  with pytest.raises(UserError, match=f"data.corpus={corpus} holds other content than {workdir} started with"):
    build_distillation(config, workdir)


def test_a_mismatched_or_missing_prepared_corpus_is_refused(prepared, tiny_teacher, tiny_corpus, tmp_path):
  with pytest.raises(UserError, match="holds blocks of 32 tokens but data.max_seq_length=64"):
    build_distillation(
      tiny_config(tiny_teacher, tiny_corpus, **{"data.prepared": prepared, "data.max_seq_length": 64}),
      str(tmp_path / "a"),
    )
  with pytest.raises(UserError, match="holds no manifest.json: prepare the corpus there first"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"data.prepared": str(tmp_path)}), str(tmp_path / "b"))
  # file:// names the local path; gs:// without gcsfs, or a scheme no file system reads, is one line.
  with pytest.raises(UserError, match=f"data.prepared={tmp_path} holds no manifest.json"):
    build_distillation(
      tiny_config(tiny_teacher, tiny_corpus, **{"data.prepared": f"file://{tmp_path}"}), str(tmp_path / "b")
    )
  for remote, message in (("gs://a-bucket/corpus", "gcsfs"), ("ftp://host/corpus", "no file system reads ftp://")):
    with pytest.raises(UserError, match=f"data.prepared={remote}: .*{message}") as error:
      build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"data.prepared": remote}), str(tmp_path / "b"))
    assert "\n" not in str(error.value)
  other = tmp_path / "other"
  os.makedirs(other)
  for name in os.listdir(prepared):  # the same shards under a manifest of another vocabulary
    if name != "manifest.json":
      os.symlink(os.path.join(prepared, name), other / name)
  manifest = json.load(open(os.path.join(prepared, "manifest.json")))
  manifest["tokenizer"]["vocab_sha256"] = "0" * 64
  (other / "manifest.json").write_text(json.dumps(manifest))
  with pytest.raises(UserError, match="was prepared with another tokenizer \\(vocab_sha256 differ\\)"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"data.prepared": str(other)}), str(tmp_path / "c"))


def test_a_damaged_or_missing_shard_is_one_line_naming_it(prepared, tiny_teacher, tmp_path):
  import shutil

  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  manifest = json.load(open(os.path.join(prepared, "manifest.json")))
  shard = manifest["shards"][1]["blocks"]
  for damage, expected in (
    ("truncate", "is damaged"),
    ("remove", "is missing"),
    ("rows", "holds 3 rows of int32, the manifest says"),
  ):
    copy = str(tmp_path / damage)
    shutil.copytree(prepared, copy)
    path = os.path.join(copy, shard)
    if damage == "truncate":
      os.truncate(path, os.path.getsize(path) // 2)
    elif damage == "remove":
      os.remove(path)
    else:
      np.save(path, np.zeros((3, 32), np.int32))
    with pytest.raises(UserError, match=f"{shard} {expected}.*prepare the corpus"):
      PreparedBlocks(copy, tokenizer, 32, str(tmp_path))


@pytest.mark.parametrize("target", ["manifest.json", "blocks", "lengths"])
@damage_settings(max_examples=20)
@given(how=st.sampled_from(DAMAGE), data=st.data())
def test_damaged_prepared_corpora_load_or_are_one_line_naming_the_file(prepared, tiny_teacher, target, how, data):
  """The manifest or a shard of a prepared corpus, damaged as tests/test_fuzz.py damages task files:
  it loads (damage that leaves it valid) or is one UserError line naming the file."""
  import shutil
  import tempfile

  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "corpus")
    shutil.copytree(prepared, copy)
    name = (
      target if target == "manifest.json" else json.load(open(os.path.join(copy, "manifest.json")))["shards"][0][target]
    )
    with open(os.path.join(copy, name), "rb") as f:
      valid = f.read()
    with open(os.path.join(copy, name), "wb") as f:
      f.write(damaged_bytes(valid, how, data))
    try:
      blocks = PreparedBlocks(copy, tokenizer, 32, tmp)
      blocks[np.arange(len(blocks))]  # every row readable
      event(f"{how}: loaded")
    except UserError as e:
      assert "\n" not in str(e) and name in str(e), str(e)
      event(f"{how}: one line")


def test_a_remote_corpus_prepared_again_is_copied_again(prepared, tiny_teacher, tmp_path, monkeypatch):
  """A host copies a remote corpus's shards once into its cache (here a local directory read as a
  remote one would be). Prepared anew with as many rows, its shards are as big as before, yet the
  run reads the new blocks: the manifest, with each shard's sha256, says the corpus changed."""
  import shutil

  from minilm_jax.data import prepared as prepared_module

  monkeypatch.setattr(prepared_module, "_on_this_host", lambda directory: False)
  tokenizer = runs.load_tokenizer_of(tiny_teacher)
  remote, cache = str(tmp_path / "remote"), str(tmp_path / "cache")
  shutil.copytree(prepared, remote)
  first = PreparedBlocks(remote, tokenizer, 32, cache)
  rows = np.arange(len(first))
  before = first[rows]["input_ids"]
  assert PreparedBlocks(remote, tokenizer, 32, cache)[rows]["input_ids"].tolist() == before.tolist()  # kept
  # Prepared again: every block's tokens in reverse order between [CLS] and [SEP], as many rows.
  blocks = [list(b[:1]) + list(b[1 : n - 1][::-1]) + list(b[n - 1 : n]) for b, n in zip(before, first[rows]["lengths"])]
  shutil.rmtree(remote)
  manifest = json.load(open(os.path.join(prepared, "manifest.json")))
  prepared_module.write_prepared(
    datasets.Dataset.from_dict({"input_ids": blocks}), tokenizer, 32, remote, len(manifest["shards"]), []
  )
  assert [os.path.getsize(os.path.join(remote, s["blocks"])) for s in manifest["shards"]] == [
    os.path.getsize(os.path.join(prepared, s["blocks"])) for s in manifest["shards"]
  ]
  after = PreparedBlocks(remote, tokenizer, 32, cache)[rows]["input_ids"]
  assert after.tolist() != before.tolist()
  np.testing.assert_array_equal(after[:, 0], before[:, 0])  # [CLS] still first
