"""Fine-tuning, evaluation and conversion: sharded step, end to end on tiny local task files, export to transformers."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from conftest import ROOT, finetune_config, load_config_module, run_in_process
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.finetuned_runs import evaluate_runs
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.models import hf
from minilm_jax.models.heads import abstract_model_params, task_model
from minilm_jax.tasks import get_task


@pytest.mark.slow
def test_finetuning_evaluators_log_the_task_and_a_probe_and_keep_the_best_step(tiny_teacher, tmp_path):
  """A fine-tuning run's evaluators (the evaluator registry, as distillation's): its task's dev
  metrics and a probe of its encoder's sentence embeddings at step 0 and every 20 steps, logged as
  eval/<name>/<metric>; `checkpoint.best` keeps the step with the best dev accuracy beside the newest.
  The task evaluator's score at the last step is the run's own results.json's; a distillation-only
  kind is refused in one line."""
  from conftest import WORDNET_SMALL
  from minilm_jax.evaluation.evaluators import evaluator

  c = finetune_config(tiny_teacher, "wordnet_supersense", WORDNET_SMALL, batch_size=32, log_every=10)
  c.evaluators.task = evaluator("task", 20)
  c.evaluators.probe = evaluator("probe", 20, task="wordnet_supersense", data_dir=WORDNET_SMALL)
  c.checkpoint.best, c.checkpoint.keep = "task/dev/accuracy", 1
  run = build_finetuning(c, str(tmp_path / "ft"))
  _, results = run.run()
  rows = [json.loads(line) for line in open(tmp_path / "ft" / "metrics.jsonl")]
  evaluated = [r for r in rows if "eval/task/dev/accuracy" in r]
  assert [r["step"] for r in evaluated] == sorted({*range(0, run.num_steps, 20), run.num_steps})
  assert all(0 <= r["eval/probe/accuracy"] <= 1 for r in evaluated)
  assert evaluated[-1]["eval/task/dev/accuracy"] == pytest.approx(results["dev/accuracy"])
  accuracy = {r["step"]: r["eval/task/dev/accuracy"] for r in evaluated}
  kept = sorted(int(s) for s in os.listdir(tmp_path / "ft" / "checkpoints") if s.isdigit())
  assert run.num_steps in kept and len(kept) <= 2
  assert max(accuracy[s] for s in kept) == max(accuracy.values())  # the best step (or one as good) kept
  c = finetune_config(tiny_teacher, "wordnet_supersense", WORDNET_SMALL)
  c.evaluators.loss = evaluator("heldout", 10)
  with pytest.raises(UserError, match="kind='heldout' needs heldout, which this program's runs do not have"):
    build_finetuning(c, str(tmp_path / "bad"))


@pytest.mark.slow
def test_sharded_step_equals_single_device(tiny_teacher, sst2_dir, tmp_path):
  """data 4 x model 2 on 8 fake devices against 1 device, 3 steps, dropout on (partitionable RNG)."""
  config = finetune_config(tiny_teacher, "sst2", sst2_dir, epochs=1)
  params = {}
  for name, mesh in (("single", parallel.make_mesh(1, 1)), ("sharded", parallel.make_mesh(4, 2))):
    run = build_finetuning(config, str(tmp_path / name), mesh=mesh)
    state, _ = run.initial_state()
    rng = jax.random.key(1)
    for b in range(3):
      state, metrics = run.step.train_step(state, parallel.shard_batch(run.stream.batch(b), mesh), rng, run.schedule)
    if name == "sharded":
      kernel = state.params["encoder"]["layer_0"]["attention"]["query"]["kernel"]
      assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, "model")  # really split over the model axis
    params[name] = traverse_util.flatten_dict(jax.device_get(state.params), sep="/")
  # Adam divides each gradient by its own running scale, so rounding noise in a small gradient (a rare
  # token's embedding row, one entry of a kernel) becomes a visible update; a sharding bug would move
  # parameters by the size of a whole update (lr 1e-3) nearly everywhere. So: no entry off by a quarter
  # of one update, and at most 1% of a tensor's entries off by more than 5% of one (single entries were
  # seen 3% and 8% off on a loaded 2-core machine, where the fake devices' reductions run in another order).
  for key in params["single"]:
    if not key.endswith("attention/key/bias"):  # zero exact gradient: pure amplified noise (see test_train)
      off = np.abs(params["sharded"][key] - params["single"][key])
      assert off.max() < 2.5e-4 and (off > 5e-5).mean() <= 0.01, (key, off.max(), (off > 5e-5).mean())


@pytest.mark.slow
def test_glue_end_to_end_finetune_evaluate_export(minilm_dir, sst2_dir, tmp_path):
  """The real all-MiniLM-L6-v2 learns a simple rule from real sentences; evaluation, submission and export follow."""
  run_dir = str(tmp_path / "sst2_run")
  _, results = build_finetuning(
    # Length 16: the rule is in the first word. On one device: the update of the real teacher's
    # 22.7M parameters is most of a step, and each data-parallel device applies all of it. Two
    # epochs at 2e-4 (16 updates) reach 1.0 on dev, as three at 1e-4 did; two at 1e-4 reach 0.81.
    finetune_config(
      minilm_dir, "sst2", sst2_dir, epochs=2, max_seq_length=16, **{"optimizer.lr": 2e-4, "mesh.data": 1}
    ),
    run_dir,
  ).run()
  assert results["dev/accuracy"] >= 0.9
  assert json.load(open(os.path.join(run_dir, "results.json")))["dev/accuracy"] == results["dev/accuracy"]

  rows = evaluate_runs([run_dir], str(tmp_path / "eval"), mesh=parallel.make_mesh(4, 2))
  assert rows[0]["split"] == "dev" and rows[0]["accuracy"] == pytest.approx(results["dev/accuracy"])
  submission = open(tmp_path / "eval" / "sst2_run" / f"step_{rows[0]['step']}" / "SST-2.tsv").read().splitlines()
  assert (
    submission[0] == "index\tprediction"
    and len(submission) == 17
    and all(l.split("\t")[1] in "01" for l in submission[1:])
  )

  out = str(tmp_path / "sst2_hf")
  runs.export_run(run_dir, out)
  config, params, tokenizer, head = runs.read_run(run_dir)[:4]
  batch = tokenizer(
    ["Return the path.", "This sentence is about something else entirely."], padding=True, return_tensors="np"
  )
  ours = task_model(config, head).apply(
    {"params": params}, *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
  )
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  assert type(model).__name__ == "BertForSequenceClassification"
  with torch.no_grad():
    theirs = model(**{k: torch.tensor(v) for k, v in batch.items()}).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)


@pytest.mark.slow
def test_squad_end_to_end_finetune_evaluate_export(tiny_teacher, squad_dir, sst2_dir, tmp_path, capfd):
  run_dir = str(tmp_path / "squad_run")
  config = finetune_config(tiny_teacher, "squad2", squad_dir, max_seq_length=24, doc_stride=8, epochs=1)
  _, results = build_finetuning(config, run_dir).run()
  assert {"dev/exact", "dev/f1", "dev/HasAns_f1", "dev/NoAns_f1", "dev/best_f1", "dev/best_f1_thresh"} <= set(results)
  features, _ = get_task("squad2").prepare("dev", config, hf.load_tokenizer(tiny_teacher))
  assert len(features) > 40  # long sentences were split into several overlapping windows
  # The README's batch evaluation of a GLUE run and a SQuAD run together, through the program.
  glue_run = str(tmp_path / "sst2_run")
  build_finetuning(finetune_config(tiny_teacher, "sst2", sst2_dir, epochs=1), glue_run).run()
  proc = run_in_process("evaluate", "--runs", f"{glue_run},{run_dir}", "--out", tmp_path / "eval", capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.load(open(tmp_path / "eval" / "metrics.json"))
  assert [(r["task"], r["split"]) for r in rows] == [("sst2", "dev"), ("squad2", "dev")]
  assert "accuracy" in rows[0] and "f1" in rows[1] and "exact" in proc.stdout and "accuracy" in proc.stdout
  predictions = json.load(open(tmp_path / "eval" / "squad_run" / f"step_{rows[1]['step']}" / "dev_predictions.json"))
  assert set(predictions) == {f"q{i}" for i in range(40)}

  out = str(tmp_path / "squad_hf")
  runs.export_run(run_dir, out)
  config, params, tokenizer, head = runs.read_run(run_dir)[:4]
  batch = tokenizer(["Which word comes first?"], ["Return the value."], return_tensors="np")
  start, end = task_model(config, head).apply(
    {"params": params}, *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
  )
  model = transformers.AutoModelForQuestionAnswering.from_pretrained(out).eval()
  with torch.no_grad():
    theirs = model(**{k: torch.tensor(v) for k, v in batch.items()})
  np.testing.assert_allclose(np.asarray(start), theirs.start_logits.numpy(), atol=1e-4)
  np.testing.assert_allclose(np.asarray(end), theirs.end_logits.numpy(), atol=1e-4)


def test_doc_stride_not_below_the_length_names_both(tiny_teacher, squad_dir):
  """The tokenizer's own error (a ValueError, a traceback) is replaced by one line with both fields."""
  for task in ("squad2", "mlqa"):
    config = finetune_config(tiny_teacher, task, squad_dir, max_seq_length=24, doc_stride=24)
    with pytest.raises(UserError, match="doc_stride=24 must be below max_seq_length=24"):
      get_task(task).prepare("dev", config, hf.load_tokenizer(tiny_teacher))
  # Below the length, but the longest question leaves no more passage per window than the stride
  # (the tokenizer would panic, a Rust PanicException that is not even an Exception).
  config = finetune_config(tiny_teacher, "squad2", squad_dir, max_seq_length=24, doc_stride=18)
  with pytest.raises(
    UserError,
    match=r"a question of \d+ tokens leaves \d+ passage tokens per window at "
    r"max_seq_length=24, not more than doc_stride=18: lower doc_stride below \d+",
  ):
    get_task("squad2").prepare("dev", config, hf.load_tokenizer(tiny_teacher))
  # A stride below that room: the windows are made.
  config = finetune_config(tiny_teacher, "squad2", squad_dir, max_seq_length=24, doc_stride=4)
  features, _ = get_task("squad2").prepare("dev", config, hf.load_tokenizer(tiny_teacher))
  assert len(features) > 0


def test_squad1_end_to_end_always_answers(tiny_teacher, squad_dir, tmp_path):
  """SQuAD 1.1 files (the answerable questions of the 2.0 fixture): every question gets a span,
  and the scores are the official 1.1 exact match and F1."""
  data = json.load(open(os.path.join(squad_dir, "dev-v2.0.json")))
  for paragraph in data["data"][0]["paragraphs"]:
    paragraph["qas"] = [qa for qa in paragraph["qas"] if not qa.pop("is_impossible")]
  for name in ("train-v1.1.json", "dev-v1.1.json"):
    (tmp_path / name).write_text(json.dumps(data))
  run_dir = str(tmp_path / "squad1_run")
  config = finetune_config(tiny_teacher, "squad1", str(tmp_path), max_seq_length=24, doc_stride=8, epochs=1)
  _, results = build_finetuning(config, run_dir).run()
  assert set(results) == {"dev/exact", "dev/f1", "dev/total"} and results["dev/total"] == 26
  rows = evaluate_runs([run_dir], str(tmp_path / "eval"))
  predictions = json.load(open(tmp_path / "eval" / "squad1_run" / f"step_{rows[0]['step']}" / "dev_predictions.json"))
  assert len(predictions) == 26 and all(predictions.values())  # no empty answers


def test_mlqa_trains_on_squad1_and_reports_each_language(tiny_teacher, squad_dir, tmp_path):
  """MLQA's files beside SQuAD 1.1's: English dev for selection, test scores per language."""
  data = json.load(open(os.path.join(squad_dir, "dev-v2.0.json")))
  for paragraph in data["data"][0]["paragraphs"]:
    paragraph["qas"] = [qa for qa in paragraph["qas"] if not qa.pop("is_impossible")]
  for name in (
    "train-v1.1.json",
    "dev-context-en-question-en.json",
    "test-context-en-question-en.json",
    "test-context-de-question-de.json",
  ):
    (tmp_path / name).write_text(json.dumps(data))
  config = finetune_config(tiny_teacher, "mlqa", str(tmp_path), max_seq_length=24, doc_stride=8, epochs=1)
  _, results = build_finetuning(config, str(tmp_path / "mlqa_run")).run()
  assert {"dev/f1_en", "test/f1_en", "test/f1_de", "test/exact_de", "test/f1"} <= set(results)
  assert "dev/f1_de" not in results  # model selection on English only, as the paper


@pytest.mark.slow
def test_convert_round_trip_reproduces_the_original(tmp_path, minilm_dir, capfd):
  run_dir, out = str(tmp_path / "run"), str(tmp_path / "hf")
  assert run_in_process("convert", "--from-hf", minilm_dir, "--out", run_dir, capfd=capfd).returncode == 0
  assert run_in_process("convert", "--to-hf", "--workdir", run_dir, "--out", out, capfd=capfd).returncode == 0
  tokenizer = hf.load_tokenizer(out)
  batch = {
    k: torch.tensor(v)
    for k, v in tokenizer(
      ["A round trip.", "Through Orbax and back to transformers."], padding=True, return_tensors="np"
    ).items()
  }
  with torch.no_grad():
    original = transformers.AutoModel.from_pretrained(minilm_dir).eval()(**batch).last_hidden_state.numpy()
    back = transformers.AutoModel.from_pretrained(out).eval()(**batch).last_hidden_state.numpy()
  np.testing.assert_array_equal(back, original)


def test_converted_run_can_teach_and_start_finetuning(tmp_path, tiny_teacher, sst2_dir):
  run_dir = str(tmp_path / "run")
  runs.write_run_from_hf(tiny_teacher, run_dir)
  config, params = runs.load_encoder(run_dir)[:2]
  expected = hf.load(tiny_teacher).params
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  build_finetuning(finetune_config(run_dir, "sst2", sst2_dir), str(tmp_path / "ft"))  # builds from the run


def test_unknown_task(tiny_teacher, tmp_path):
  with pytest.raises(UserError, match="unknown task 'sst3'"):
    build_finetuning(finetune_config(tiny_teacher, "sst3", ""), str(tmp_path / "w"))


def test_data_file_with_missing_columns_or_unknown_labels(tiny_teacher, tmp_path):
  (tmp_path / "train.tsv").write_text("text\tlabel\nA sentence.\t1\n")
  with pytest.raises(UserError, match=r"lacks columns \['sentence'\]"):
    build_finetuning(finetune_config(tiny_teacher, "sst2", str(tmp_path)), str(tmp_path / "w"))
  (tmp_path / "train.tsv").write_text("sentence\tlabel\nA sentence.\tpositive\n")
  with pytest.raises(UserError, match=r"train.tsv:2: unknown sst2 label 'positive'"):
    build_finetuning(finetune_config(tiny_teacher, "sst2", str(tmp_path)), str(tmp_path / "w"))


def test_init_that_is_neither_run_nor_hf_directory(tmp_path, sst2_dir):
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match="neither a run's workdir"):
    build_finetuning(finetune_config(str(tmp_path / "empty"), "sst2", sst2_dir), str(tmp_path / "w"))


def test_head_and_label_count_mismatch_on_export(tmp_path, tiny_teacher):
  params = hf.load(tiny_teacher).params
  config = hf.read_config(tiny_teacher)
  task_params = {"encoder": params, "classifier": {"kernel": jnp.zeros((32, 3)), "bias": jnp.zeros(3)}}
  with pytest.raises(UserError, match="3 outputs but the head names 2 labels"):
    hf.save(
      str(tmp_path / "out"), config, task_params, head={"kind": "classification", "num_labels": 2, "labels": ["0", "1"]}
    )


def test_cli_errors_are_one_line(tmp_path):
  """On the command line of `convert` and `finetune`: one line and exit 2."""
  proc = subprocess.run(
    [sys.executable, "-m", "minilm_jax.convert", "--to-hf", "--workdir", tmp_path / "missing", "--out", tmp_path / "o"],
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: ")
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "minilm_jax.finetune",
      "--config",
      os.path.join(ROOT, "configs/finetune/glue.py"),
      "--workdir",
      str(tmp_path / "w"),
      "--config.task=nope",
      f"--config.init={tmp_path}",
    ],
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 2 and "error: unknown task 'nope'" in proc.stderr


@pytest.mark.slow
def test_grid_is_one_batch_job_with_the_best_marked(tiny_teacher, sst2_dir, tmp_path):
  from minilm_jax.finetuning.grid import run_grid

  config = finetune_config(tiny_teacher, "sst2", sst2_dir)
  config.grid.lrs, config.grid.epochs = (1e-3, 1e-6), (1,)
  rows, best = run_grid(config, str(tmp_path))
  assert [(r["lr"], r["epochs"]) for r in rows] == [(1e-3, 1), (1e-6, 1)]
  scores = [r["dev/accuracy"] for r in rows]
  assert best == int(np.argmax(scores))
  csv_rows = open(tmp_path / "grid.csv").read().splitlines()
  assert (
    csv_rows[0].startswith("lr,epochs,seeds,dev/accuracy") and [l.split(",")[-1] for l in csv_rows[1:]].count("1") == 1
  )
  marked = [l for l in open(tmp_path / "grid.md").read().splitlines() if l.startswith("| ") and "**best**" in l]
  assert len(marked) == 1 and marked[0].startswith(f"| {rows[best]['lr']} |")


@pytest.mark.slow
def test_grid_with_seeds_reports_mean_and_std_and_picks_by_the_mean(tiny_teacher, sst2_dir, tmp_path):
  from minilm_jax.finetuning.grid import run_grid

  config = finetune_config(tiny_teacher, "sst2", sst2_dir)
  config.grid.lrs, config.grid.epochs, config.seeds = (1e-3, 1e-4), (1,), 2
  rows, best = run_grid(config, str(tmp_path))
  for row in rows:
    runs_of = [
      json.load(open(os.path.join(row["workdir"], f"seed{k}", "results.json")))["dev/accuracy"] for k in (0, 1)
    ]
    assert row["seeds"] == 2 and row["dev/accuracy"] == pytest.approx(np.mean(runs_of))
    assert row["dev/accuracy_std"] == pytest.approx(np.std(runs_of, ddof=1))
  assert best == int(np.argmax([r["dev/accuracy"] for r in rows]))
  header = open(tmp_path / "grid.csv").read().splitlines()[0].split(",")
  assert header[:5] == ["lr", "epochs", "seeds", "dev/accuracy", "dev/accuracy_std"]


@pytest.mark.slow
def test_runs_of_one_shape_share_one_compiled_step_and_end_as_alone(tiny_teacher, sst2_dir, tmp_path, monkeypatch):
  """A second run in the process whose step differs only in what the step takes as arguments (its
  seed, learning rate and length) finds the first one's jitted step, predictor and initialiser and
  traces none of them again; it ends bitwise as the same run does with functions built for it."""
  from minilm_jax.training import reuse

  first = build_finetuning(finetune_config(tiny_teacher, "sst2", sst2_dir), str(tmp_path / "first"))
  first.run()
  overrides = {"seed": 1, "optimizer.lr": 3e-4, "epochs": 2}
  second = build_finetuning(finetune_config(tiny_teacher, "sst2", sst2_dir, **overrides), str(tmp_path / "second"))
  assert second.step is first.step and second.predict is first.predict
  state, results = second.run()
  compiled = (second.step.train_step, second.step.init, second.predict.forward)
  assert [f._cache_size() for f in compiled] == [1, 1, 1]  # one trace each, for both runs
  monkeypatch.setattr(reuse, "_built", type(reuse._built)())  # nothing kept: built anew
  alone = build_finetuning(finetune_config(tiny_teacher, "sst2", sst2_dir, **overrides), str(tmp_path / "alone"))
  assert alone.step is not first.step
  alone_state, alone_results = alone.run()
  assert alone_results == results and int(state.step) == int(alone_state.step) == 2 * first.num_steps
  ours, theirs = (traverse_util.flatten_dict(jax.device_get(s.params), sep="/") for s in (state, alone_state))
  for key, value in theirs.items():
    np.testing.assert_array_equal(ours[key], value, err_msg=key)


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "configs", "finetune"))))
def test_every_finetune_config_builds(name):
  config = load_config_module(os.path.join(ROOT, "configs", "finetune", name)).get_config()
  task = get_task(config.task)
  from minilm_jax.models.encoder import EncoderConfig

  shapes = abstract_model_params(EncoderConfig(num_layers=2), task.head(config))
  assert "encoder" in shapes and len(shapes) == (4 if task.head(config)["kind"] == "seq2seq" else 2)
  assert config.batch_size > 0 and config.grid.lrs and config.grid.epochs


def test_xnli_scores_overall_and_per_language(tmp_path, minilm):
  *_, tokenizer = minilm
  header = "language\tgold_label\tsentence1_binary_parse\tsentence1\tsentence2\n"
  rows = [
    ("en", "entailment", "A man sleeps.", "A person sleeps."),
    ("de", "neutral", "Ein Mann schläft.", "Er träumt."),
    ("de", "contradiction", "Ein Mann schläft.", "Er rennt."),
    ("en", "neutral", "It rains.", "It is cold."),
  ]
  (tmp_path / "dev.tsv").write_text(header + "".join(f"{l}\t{y}\t()\t{a}\t{b}\n" for l, y, a, b in rows))
  task = get_task("xnli")
  examples = task.load("dev", str(tmp_path))
  assert examples["group"] == ["en", "de", "de", "en"] and examples["label"] == [1, 2, 0, 2]
  scores = task.score(np.array([1, 2, 2, 0]), examples)
  assert scores == {"accuracy": 0.5, "accuracy_de": 0.5, "accuracy_en": 0.5, "accuracy_average": 0.5}
  features = task.features(examples, tokenizer, 16)
  assert len(features[0]["input_ids"]) == 16 and features[0]["token_type_ids"][-1] in (0, 1)


@pytest.mark.slow
def test_xnli_trains_on_mnli_format_and_reports_dev_and_test_per_language(tmp_path, tiny_teacher):
  """The paper's recipe: MNLI-format English training rows (no language column), model selection
  on XNLI dev, accuracy per language and their average on XNLI's labelled test set."""
  mnli_header = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n"
  )
  labels = ("entailment", "neutral", "contradiction")
  train = [(f"A man number {i} sleeps.", f"Someone {i} rests.", labels[i % 3]) for i in range(24)]
  (tmp_path / "train.tsv").write_text(
    mnli_header
    + "".join(f"{i}\t{i}\t{i}e\tfiction\t()\t()\t()\t()\t{a}\t{b}\t{y}\t{y}\n" for i, (a, b, y) in enumerate(train))
  )
  xnli_header = (
    "language\tgold_label\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2\tpromptID\tpairID\tgenre\tlabel1\n"
  )
  for split in ("dev", "test"):
    rows = [(lang, labels[i % 3], f"Satz {i}.", f"Zweiter {i}.") for i in range(6) for lang in ("en", "de", "zh")]
    (tmp_path / f"{split}.tsv").write_text(
      xnli_header
      + "".join(f"{l}\t{y}\t()\t()\t()\t()\t{a}\t{b}\t{i}\t{i}\tfiction\t{y}\n" for i, (l, y, a, b) in enumerate(rows))
    )
  run_dir = str(tmp_path / "xnli_run")
  _, results = build_finetuning(
    finetune_config(tiny_teacher, "xnli", str(tmp_path), max_seq_length=24, batch_size=8, epochs=2), run_dir
  ).run()
  for split in ("dev", "test"):
    assert {f"{split}/accuracy_{l}" for l in ("en", "de", "zh")} | {f"{split}/accuracy_average"} <= set(results)
  saved = json.load(open(os.path.join(run_dir, "results.json")))  # every epoch, the best chosen on dev
  assert [e["epoch"] for e in saved["epochs"]] == [1, 2] and saved["epochs"][-1]["test/accuracy"] == results[
    "test/accuracy"
  ]
  best = max(saved["epochs"], key=lambda e: e["dev/accuracy"])
  assert saved["best_epoch"] == best["epoch"] and saved["best"] == {"dev/accuracy": best["dev/accuracy"]}
  rows = evaluate_runs([run_dir], str(tmp_path / "eval"))
  assert [r["split"] for r in rows] == ["dev", "test"]
  assert rows[1]["accuracy"] == pytest.approx(results["test/accuracy"]) and "accuracy_zh" in rows[1]


@pytest.mark.slow
def test_custom_task_from_a_csv_with_six_labels_finetunes_evaluates_and_exports(tmp_path, tiny_teacher):
  """The user's own data defined in the config alone; the exported transformers classifier names
  and predicts the same classes as our evaluation."""
  import csv

  topics = ("sport", "music", "food", "travel", "money", "weather")
  for split, count in (("train", 48), ("dev", 18)):
    with open(tmp_path / f"{split}.csv", "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["id", "sentence", "topic"])
      for i in range(count):
        writer.writerow([i, f"this line is about {topics[i % 6]}, number {i}", topics[i % 6]])
  config = finetune_config(tiny_teacher, "custom", "", max_seq_length=16, epochs=2)
  config.data.train, config.data.dev = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
  config.data.text_columns, config.data.label_column = "sentence", "topic"
  run_dir = str(tmp_path / "custom_run")
  _, results = build_finetuning(config, run_dir).run()
  assert {"dev/accuracy", "dev/macro_f1"} <= set(results)
  rows = evaluate_runs([run_dir], str(tmp_path / "eval"))
  assert rows[0]["accuracy"] == pytest.approx(results["dev/accuracy"])
  ours = [
    line.split("\t")[1]
    for line in open(tmp_path / "eval" / "custom_run" / f"step_{rows[0]['step']}" / "dev_predictions.tsv")
    .read()
    .splitlines()[1:]
  ]
  assert set(ours) <= set(topics)

  out = str(tmp_path / "custom_hf")
  runs.export_run(run_dir, out)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
  assert sorted(model.config.id2label.values()) == sorted(topics)
  tokenizer = transformers.AutoTokenizer.from_pretrained(out)
  texts = [f"this line is about {topics[i % 6]}, number {i}" for i in range(18)]
  with torch.no_grad():
    logits = model(**tokenizer(texts, padding="max_length", max_length=16, truncation=True, return_tensors="pt")).logits
  assert [model.config.id2label[int(i)] for i in logits.argmax(-1)] == ours

  config.data.text_columns = "sentence,missing"
  with pytest.raises(UserError, match="has no column\\(s\\) \\['missing'\\]"):
    build_finetuning(config, str(tmp_path / "bad"))


@pytest.mark.slow
def test_attention_maps_png(tmp_path, tiny_teacher, capfd):
  """On the command line; then a head the teacher lacks, in process."""
  out = tmp_path / "maps.png"
  argv = ["--teacher", tiny_teacher, "--student", tiny_teacher, "--out", str(out), "--heads"]
  proc = subprocess.run(
    [sys.executable, "-m", "minilm_jax.attention_maps", *argv, "0,3"], capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
  proc = run_in_process("attention_maps", *argv, "7", capfd=capfd)
  assert proc.returncode == 2 and "has 4 heads" in proc.stderr


@pytest.mark.slow
def test_evaluating_every_checkpoint_of_a_run(tiny_teacher, sst2_dir, tmp_path):
  """--all_steps: one row per kept checkpoint, each scored with its own parameters."""
  run_dir = str(tmp_path / "steps")
  build_finetuning(
    finetune_config(tiny_teacher, "sst2", sst2_dir, epochs=2, **{"checkpoint.every": 4, "checkpoint.keep": 3}), run_dir
  ).run()
  rows = evaluate_runs([run_dir], str(tmp_path / "eval"), all_steps=True)
  steps = [r["step"] for r in rows]
  assert steps == sorted(steps) and len(steps) >= 2 and steps[-1] == 16
  assert os.path.exists(tmp_path / "eval" / "steps" / f"step_{steps[0]}" / "dev_predictions.tsv")


def test_a_new_task_is_one_registry_entry(tiny_teacher, tmp_path, monkeypatch, sentences):
  """The README's "Extending" example: one `ClassificationTask` entry, and the task fine-tunes and
  is scored on its own files (three classes by a sentence's first word)."""
  from minilm_jax import tasks
  from minilm_jax.tasks.glue import TASKS, ClassificationTask

  entry = ClassificationTask(
    "my_nli",
    ("premise", "hypothesis"),
    "label",
    ("entailment", "neutral", "contradiction"),
    ("accuracy",),
    ("my-org/my_nli", None),
    ("premise", "hypothesis"),
  )
  monkeypatch.setitem(tasks.TASKS, "my_nli", entry)
  assert "my_nli" not in TASKS  # registered for this test only
  labels = ("entailment", "neutral", "contradiction")
  rows = [(a, b, labels[len(a.split()[0]) % 3]) for a, b in zip(sentences[:48], sentences[1:49])]
  for name, part in (("train", rows[:32]), ("dev", rows[32:])):
    (tmp_path / f"{name}.tsv").write_text("premise\thypothesis\tlabel\n" + "".join("\t".join(r) + "\n" for r in part))
  run_dir = str(tmp_path / "run")
  _, results = build_finetuning(finetune_config(tiny_teacher, "my_nli", str(tmp_path)), run_dir).run()
  assert set(results) == {"dev/accuracy"} and 0 <= results["dev/accuracy"] <= 1
  assert json.load(open(os.path.join(run_dir, "results.json")))["task"] == "my_nli"


def test_a_plain_fine_tuning_run_hands_its_config_to_the_few_places_it_needs(tiny_teacher, sst2_dir, tmp_path):
  """`build_finetuning`'s config (or a block of it) reaches at most 25 functions in 12 modules
  (`tests/config_walk.py`, the dynamic walk), and none of the second stage's: without
  `distill.teacher` no teacher is read and nothing is augmented."""
  from config_walk import summary, walk_call

  stops = walk_call(build_finetuning, finetune_config(tiny_teacher, "sst2", sst2_dir), str(tmp_path / "ft"))
  functions, modules = summary(stops)
  assert functions <= 25 and modules <= 12, list(stops)
  second_stage = [f for path, f in stops if path.endswith("augment.py") or f in ("load_teacher", "teacher_features")]
  assert not second_stage and ("finetuning/run.py", "build_finetuning") in stops
