"""The distillation loop's evaluators (evaluation/evaluators.py), through the program: what they log
and when, against values computed without our code (transformers' PyTorch model on the exported
checkpoint, scipy's Spearman, scikit-learn's probe, retrieval worked out in plain numpy), the
held-out blocks that training never reads, a resume that logs nothing twice, the best checkpoint
kept beside the newest, and bad evaluator configs as one line before anything is written."""

import json
import os

import numpy as np
import pytest
from scipy import stats

from conftest import SENTENCES, apply_overrides, tiny_config
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.distill.family import LONE
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.evaluation import evaluators

# Sentences of two kinds for the probe and the retrieval: questions about one topic and another.
_ANIMALS = [
  "The dog barked at the mailman all morning.",
  "A cat sleeps in the sun on the porch.",
  "Horses graze quietly in the green field.",
  "The bird sang a song from the tall tree.",
  "Cows were milked early at the farm.",
  "The fox slipped under the fence at night.",
]
_MACHINES = [
  "The engine needs new oil every winter.",
  "Press the red button to start the printer.",
  "The laptop battery drains far too quickly.",
  "Gears turn inside the old clock tower.",
  "The robot arm welds the car frames.",
  "A pump moves water through the pipes.",
]


def _files(tmp_path):
  probe_train = tmp_path / "probe_train.csv"
  probe_dev = tmp_path / "probe_dev.csv"
  rows = [(s, "animal") for s in _ANIMALS] + [(s, "machine") for s in _MACHINES]
  probe_train.write_text("text,label\n" + "".join(f'"{s}",{y}\n' for s, y in rows[::2] + rows[1::4]))
  probe_dev.write_text("text,label\n" + "".join(f'"{s}",{y}\n' for s, y in rows[1::2]))
  retrieval = tmp_path / "retrieval.tsv"
  retrieval.write_text(
    "animals on a farm\t" + _ANIMALS[4] + "\n"
    "animals on a farm\t" + _ANIMALS[2] + "\n"
    "machines that break\t" + _MACHINES[2] + "\n"
    "a pet at home\t" + _ANIMALS[1] + "\n"
    "machines that break\t" + _MACHINES[0] + "\n"
  )
  sts = tmp_path / "sts.tsv"
  pairs = list(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])) + list(zip(_ANIMALS, _MACHINES))
  sts.write_text(
    "sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{(i * 7) % 5}.0\n" for i, (a, b) in enumerate(pairs))
  )
  return str(probe_train), str(probe_dev), str(retrieval), str(sts)


def _config(teacher, corpus, tmp_path, **overrides):
  probe_train, probe_dev, retrieval, sts = _files(tmp_path)
  c = tiny_config(teacher, corpus, **{"num_steps": 3, "checkpoint.every": 100, "data.heldout_blocks": 16})
  c.eval_batch_size = 8
  c.checkpoint.keep = 1
  c.checkpoint.best = "heldout/loss"
  c.evaluators.heldout = evaluators.evaluator("heldout", 2)
  c.evaluators.pairs = evaluators.evaluator("retrieval", 2, data=retrieval, max_seq_length=16)
  c.evaluators.sts = evaluators.evaluator("sts", 2, file=sts, max_seq_length=16)
  c.evaluators.topic = evaluators.evaluator("probe", 2, task="custom", train=probe_train, dev=probe_dev)
  return apply_overrides(c, overrides)


def _torch_embeddings(model_dir, texts, length):
  """Mean-pooled last hidden states of transformers' PyTorch BertModel: no code of ours."""
  import torch
  import transformers

  tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
  model = transformers.BertModel.from_pretrained(model_dir).eval()
  enc = tokenizer(texts, truncation=True, max_length=length, padding="max_length", return_tensors="pt")
  with torch.no_grad():
    hidden = model(**enc).last_hidden_state.numpy().astype(np.float64)
  mask = enc["attention_mask"].numpy()[..., None].astype(np.float64)
  return (hidden * mask).sum(1) / mask.sum(1)


def _cosine(a, b):
  return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _rows(workdir):
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.slow
def test_evaluators_log_scores_that_independent_code_reproduces(tiny_teacher, tiny_corpus, tmp_path, capsys):
  from sklearn.linear_model import LogisticRegression

  workdir = str(tmp_path / "run")
  run = build_distillation(_config(tiny_teacher, tiny_corpus, tmp_path), workdir)
  # The last 16 blocks are held out: the training stream reads only the blocks before them.
  first_heldout = run.record().heldout["first_block"]
  assert run.record().heldout["blocks"] == 16 and len(run.stream.rows) == first_heldout
  assert max(run.stream.indices(b).max() for b in range(run.stream.batches_per_epoch)) < first_heldout
  run.run()
  table = capsys.readouterr().out
  assert "| teacher |" in table and "| start (step 0): the teacher's uniform layers" not in table
  assert "| start (step 0): random init |" in table and "| student (step 3) |" in table

  # Every evaluator compiled once: its later calls only ran.
  encoders = [*run.lone.evaluators.context._student_encoders.values(), *run.shared.teacher_scores.encoders.values()]
  assert len(encoders) == 4  # student and teacher, at the sentence evaluators' 16 and the run's 32 tokens
  assert [e.predict.forward._cache_size() for e in encoders] == [1] * 4
  assert run.train_step.heldout[LONE]._cache_size() == 1

  rows = _rows(workdir)
  evaluated = [r["step"] for r in rows if "eval/heldout/loss" in r]
  assert evaluated == [0, 2, 3]  # step 0 (the start), every 2 steps, and the last
  assert all("eval/sts/teacher/spearman" in r for r in rows if r["step"] == 0)
  last = rows[-1]
  assert {"eval/heldout/loss_qk", "eval/heldout/loss_vv", "eval/pairs/mrr@10", "eval/topic/accuracy"} <= set(last)

  # The student at step 3, exported, computed by transformers' PyTorch model.
  out = str(tmp_path / "hf")
  runs.export_run(workdir, out, step=3)
  probe_train, probe_dev, retrieval, sts = _files(tmp_path / "..")  # the same files, written again
  import csv

  def column(path, i):
    return [r[i] for r in csv.reader(open(path))][1:]

  # STS: scipy's Spearman of the cosine, student and teacher.
  lines = [line.rstrip("\n").split("\t") for line in open(sts)][1:]
  a, b, gold = [x[0] for x in lines], [x[1] for x in lines], [float(x[2]) for x in lines]
  for who, model_dir, key in ((out, out, "eval/sts/spearman"), ("teacher", tiny_teacher, "eval/sts/teacher/spearman")):
    cos = _cosine(_torch_embeddings(model_dir, a, 16), _torch_embeddings(model_dir, b, 16))
    logged = last[key] if key in last else rows[0][key]
    assert logged == pytest.approx(stats.spearmanr(cos, gold).statistic, abs=1e-4), who

  # Probe: scikit-learn's logistic regression on the same embeddings (the run's length, 32).
  train_x = _torch_embeddings(out, column(probe_train, 0), 32)
  dev_x = _torch_embeddings(out, column(probe_dev, 0), 32)
  probe = LogisticRegression(max_iter=2000).fit(train_x, column(probe_train, 1))
  assert last["eval/topic/accuracy"] == pytest.approx(np.mean(probe.predict(dev_x) == np.array(column(probe_dev, 1))))

  # Retrieval, by hand: each query's documents ranked by cosine; recall@1 and reciprocal rank.
  pairs = [line.rstrip("\n").split("\t") for line in open(retrieval)]
  queries = list(dict.fromkeys(q for q, _ in pairs))
  documents = list(dict.fromkeys(d for _, d in pairs))
  q, d = _torch_embeddings(out, queries, 16), _torch_embeddings(out, documents, 16)
  recall1, reciprocal = [], []
  for i, query in enumerate(queries):
    relevant = {documents.index(doc) for qq, doc in pairs if qq == query}
    ranked = sorted(range(len(documents)), key=lambda j: -_cosine(q[i], d[j]))
    recall1.append(len(relevant & {ranked[0]}) / len(relevant))
    reciprocal.append(1 / (1 + min(ranked.index(j) for j in relevant)))
  assert last["eval/pairs/recall@1"] == pytest.approx(np.mean(recall1), abs=1e-6)
  assert last["eval/pairs/mrr@10"] == pytest.approx(np.mean(reciprocal), abs=1e-6)

  # The best step (lowest held-out loss) is kept beside the newest one.
  losses = {r["step"]: r["eval/heldout/loss"] for r in rows if "eval/heldout/loss" in r}
  best = min(losses, key=losses.get)
  kept = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit())
  assert kept == sorted({3, best})

  # Resumed for 2 more steps: the new evaluations (4 and 5) are logged once, the earlier not again.
  build_distillation(_config(tiny_teacher, tiny_corpus, tmp_path, num_steps=5), workdir).run()
  steps = [r["step"] for r in _rows(workdir) if "eval/heldout/loss" in r]
  assert steps == [0, 2, 3, 4, 5]


def test_heldout_loss_on_eight_devices_equals_one_device(tiny_teacher, tiny_corpus, tmp_path):
  """The held-out evaluator's sharded loss is the single-device one (same blocks, same parameters)."""
  import jax

  config = _config(tiny_teacher, tiny_corpus, tmp_path)
  config.evaluators = {"heldout": evaluators.evaluator("heldout", 2)}
  config.checkpoint.best = ""
  scores = []
  for mesh in (parallel.make_mesh(), parallel.make_mesh(devices=jax.devices()[:1])):
    run = build_distillation(config, str(tmp_path / f"run{len(scores)}"), mesh=mesh)
    state, _ = run.initial_state()
    scores.append(run.lone.evaluators(0, state.params))
  assert len(jax.devices()) == 8
  assert scores[0].keys() == scores[1].keys() and "eval/heldout/loss" in scores[0]
  for key in scores[0]:
    assert scores[0][key] == pytest.approx(scores[1][key], rel=1e-5), key


@pytest.mark.parametrize(
  "change, message",
  [
    ({"evaluators.heldout.kind": "bleu"}, "evaluators.heldout.kind='bleu' is unknown: choose one of heldout, probe"),
    ({"evaluators.heldout.every": 0}, "evaluators.heldout.every=0: evaluate every 1 or more steps"),
    ({"evaluators.sts.file": "/no/such.tsv"}, "evaluators.sts.file='/no/such.tsv' does not exist: fix the path"),
    ({"evaluators.topic.train": "/no/train.csv"}, "evaluators.topic.train='/no/train.csv' does not exist"),
    ({"checkpoint.best": "wordnet/mrr@10"}, "checkpoint.best='wordnet/mrr@10' names no evaluator"),
    ({"checkpoint.best": "sts/accuracy"}, "checkpoint.best='sts/accuracy': evaluator sts reports spearman"),
    ({"data.heldout_blocks": 0}, "evaluators.heldout (heldout) needs blocks held out of training"),
    ({"evaluators.heldout.kind": "task"}, "evaluators.heldout.kind='task' needs task, which this program's runs"),
    ({"evaluators.topic.max_seq_length": -4}, "evaluators.topic.max_seq_length=-4: give a length of at least 2"),
    (
      {"evaluators.pairs.max_seq_length": 4096},
      "evaluators.pairs.max_seq_length=4096 exceeds the 64 positions of the model it reads",
    ),
  ],
)
def test_bad_evaluator_configs_are_one_line_before_anything_is_written(
  tiny_teacher, tiny_corpus, tmp_path, change, message
):
  config = _config(tiny_teacher, tiny_corpus, tmp_path, **change)
  workdir = str(tmp_path / "run")
  with pytest.raises(UserError) as error:
    build_distillation(config, workdir)
  assert message in str(error.value) and "\n" not in str(error.value)
  assert not os.path.exists(workdir)


def test_a_probes_missing_task_files_name_the_evaluators_data_dir(tiny_teacher, tiny_corpus, tmp_path):
  """A probe reads its own `data_dir`: a folder without the task's files is one line naming that
  field (the task's own line named the program's `data_dir`, which the probe does not read)."""
  empty = tmp_path / "empty"
  empty.mkdir()
  overrides = {"evaluators.topic.task": "wordnet_supersense", "evaluators.topic.data_dir": str(empty)}
  config = _config(tiny_teacher, tiny_corpus, tmp_path, **overrides)
  with pytest.raises(UserError, match=r"^evaluators.topic: WordNet's .* set evaluators.topic.data_dir to") as error:
    build_distillation(config, str(tmp_path / "run"))
  assert "\n" not in str(error.value)


def test_an_sts_file_without_pairs_is_one_line(tiny_teacher, tiny_corpus, tmp_path):
  header_only = tmp_path / "header.tsv"
  header_only.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n")
  config = _config(tiny_teacher, tiny_corpus, tmp_path, **{"evaluators.sts.file": str(header_only)})
  with pytest.raises(UserError, match=r"evaluators.sts.file=.* has 0 scored sentence pairs") as error:
    build_distillation(config, str(tmp_path / "run"))
  assert "\n" not in str(error.value)


@pytest.mark.parametrize(
  "task, best, reported",
  [
    ("sst2", "task/dev/accuracy", True),
    ("mnli", "task/dev_mismatched/accuracy", True),
    ("xnli", "task/test/accuracy_de", True),  # per language
    ("squad2", "task/dev/best_f1", True),  # the official best threshold's
    ("squad2", "task/dev/HasAns_exact", True),
    ("mlqa", "task/dev/f1_de", True),
    ("qg", "task/dev/rougeL", True),
    ("sst2", "task/dev/f1", False),  # sst2 reports accuracy alone
    ("mnli", "task/dev/accuracy", False),  # mnli's dev splits are dev_matched and dev_mismatched
    ("squad2", "task/dev/accuracy", False),
  ],
)
def test_checkpoint_best_of_the_task_evaluator_is_a_metric_the_task_reports(tmp_path, task, best, reported):
  """The task evaluator reports whatever the run's task does, so `checkpoint.best` naming it is held
  against the task in `build_finetuning`, before the model or data are read: a metric the task never
  reports would train to the end and keep no best step."""
  from minilm_jax.finetuning.config import base_config as finetune_base
  from minilm_jax.finetuning.run import build_finetuning

  c = finetune_base()
  c.task, c.init = task, str(tmp_path / "no_model_read_before_the_check")
  c.evaluators.task = evaluators.evaluator("task", 10)
  c.checkpoint.best = best
  if reported:
    with pytest.raises(UserError, match="init"):  # past the check, at reading the model
      build_finetuning(c, str(tmp_path / "run"))
  else:
    with pytest.raises(UserError, match=f"checkpoint.best='{best}': {task} reports .*: pick one of them"):
      build_finetuning(c, str(tmp_path / "run"))
