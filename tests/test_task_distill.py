"""Task and multi-task distillation end to end on the real WordNet tasks, with a tiny teacher:
fine-tuned teachers, the multi-task refined teacher, teacher logits against transformers, the
BiLSTM / bi-attentive / Transformer students, resume, and the one-line errors."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import (
  ROOT,
  WORDNET_SMALL,
  WORDNET_SMALL_TRAIN,
  count_checkpoint_openings,
  load_config_module,
  run_distill_task,
  run_in_process,
)
from minilm_jax import runs
from minilm_jax.data import augment
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.finetuned_runs import evaluate_runs
from minilm_jax.finetuning.config import base_config
from minilm_jax.finetuning.distillation import distillation_loss
from minilm_jax.finetuning.multitask import build_multitask_finetuning
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.finetuning.teachers import TeacherRun, find_teachers, teacher_logits
from minilm_jax.models.encoder import Encoder
from minilm_jax.models.heads import apply_model
from minilm_jax.runs import lock
from minilm_jax.task_distill.config import left_to_run, mkd_config, task_distillation_config
from minilm_jax.task_distill.run import build_task_distillation, run_lr_grid
from minilm_jax.tasks import get_task
from minilm_jax.tasks.inputs import task_features
from minilm_jax.transfer.objectives import Outputs

# Its module fixtures are built once: the tests of each fixture run on one xdist worker (those of
# the refined teacher in a group of their own, which a second worker can take).
pytestmark = pytest.mark.xdist_group("task_distill")
REFINED_TEACHER_GROUP = pytest.mark.xdist_group("task_distill_refined")

TASKS = ("wordnet_supersense", "wordnet_examples")


def _finetune_config(init, task):
  c = base_config()
  c.task, c.init, c.epochs, c.max_seq_length, c.batch_size, c.log_every = task, init, 1, 32, 64, 20
  c.data_dir = WORDNET_SMALL
  c.optimizer.lr = 1e-3
  c.mesh.data = 2  # data parallel on two of the 8 fake devices: the 2 cores run 4x fewer replicas
  return c


@pytest.fixture(scope="module")
def teachers(tmp_path_factory, tiny_teacher):
  """{task: a tiny teacher fine-tuned on it (one epoch)}."""
  out = {}
  for task in TASKS:
    out[task] = str(tmp_path_factory.mktemp(task))
    build_finetuning(_finetune_config(tiny_teacher, task), out[task]).run()
  return out


@pytest.fixture(scope="module")
def refined_teacher(tmp_path_factory, tiny_teacher):
  """Each task from its own folder (`data_dir` a comma list): the second a copy of the excerpt."""
  import shutil

  workdir, second = str(tmp_path_factory.mktemp("refined")), str(tmp_path_factory.mktemp("wordnet_copy"))
  shutil.copy(os.path.join(WORDNET_SMALL, "data.noun"), second)
  config = _finetune_config(tiny_teacher, ",".join(TASKS))
  config.data_dir = f"{WORDNET_SMALL},{second}"
  _, results = build_multitask_finetuning(config, workdir).run()
  return workdir, results


def test_per_task_data_folders():
  from minilm_jax.tasks.inputs import parse_tasks, task_data_dirs

  tasks = parse_tasks(",".join(TASKS))
  assert task_data_dirs(tasks, "a, b") == {TASKS[0]: "a", TASKS[1]: "b"}
  assert task_data_dirs(tasks, "a") == {TASKS[0]: "a", TASKS[1]: "a"}
  with pytest.raises(UserError, match="data_dir names 3 folders for 2 tasks"):
    task_data_dirs(tasks, "a,b,c")


def _student_config(tasks, teacher, **student):
  c = task_distillation_config() if "," not in tasks else mkd_config()
  c.tasks, c.teacher, c.max_seq_length, c.epochs, c.batch_size = tasks, teacher, 32, 1, 80
  c.data_dir = WORDNET_SMALL
  c.augment.size_factor, c.augment.n_iter = 2, 3
  c.student.embed_dim, c.student.hidden, c.student.fc = 16, 8, 16
  for k, v in student.items():
    setattr(c.student, k, v)
  c.log_every = 20
  c.mesh.data = 2
  return c


@pytest.mark.slow
def test_distilled_bilstm_runs_with_augmentation_and_caches_teacher_logits(tmp_path, teachers, monkeypatch):
  """... and the teacher run's checkpoints are opened once for its record and step, once more for its
  weights when its logits are not cached yet; a rerun after the teacher changed at its path is
  refused."""
  task = "wordnet_supersense"
  teacher = str(tmp_path / "teacher")  # a copy, changed at the end
  shutil.copytree(teachers[task], teacher)
  c = _student_config(task, teacher)
  c.cache_dir = str(tmp_path / "cache")
  opened = count_checkpoint_openings(monkeypatch)
  run = build_task_distillation(c, str(tmp_path / "a"))
  assert opened.count(teacher) == 2, opened
  originals = WORDNET_SMALL_TRAIN[task]
  assert 1.5 * originals < len(run.stream.streams[task].rows) <= 2 * originals  # up to one copy each
  _, results = run.run()
  assert 0 <= results[f"{task}/dev/accuracy"] <= 1
  saved = json.load(open(tmp_path / "a" / "results.json"))
  assert saved["tasks"] == [task] and saved["step"] == run.num_steps
  cached = sorted(os.listdir(c.cache_dir))
  assert [os.path.splitext(name)[1] for name in cached] == [".parquet", ".npy"], cached  # augmented-*, the logits
  # A second run on the same augmented set reads it and the teacher logits from the cache: no
  # tagger, no teacher weights.
  stamps = [os.path.getmtime(os.path.join(c.cache_dir, name)) for name in cached]
  monkeypatch.setattr(augment, "load_pos_tagger", lambda: pytest.fail("augmented again"))
  again = build_task_distillation(c, str(tmp_path / "b"))
  assert opened.count(teacher) == 3, opened  # the record alone: the logits were cached
  assert sorted(os.listdir(c.cache_dir)) == cached
  assert [os.path.getmtime(os.path.join(c.cache_dir, name)) for name in cached] == stamps
  assert again.stream.streams[task].rows["teacher_logits"] == run.stream.streams[task].rows["teacher_logits"]
  # Rerunning the finished run resumes after its last step and reports the saved model's scores.
  assert build_task_distillation(c, str(tmp_path / "a")).run()[1] == results
  from minilm_jax import runs

  with pytest.raises(UserError, match="holds a bilstm student, which has no Transformer encoder"):
    runs.export_run(str(tmp_path / "a"), str(tmp_path / "hf"))
  # Batch evaluation restores the student and reproduces the run's own dev score.
  rows = evaluate_runs([str(tmp_path / "a")], str(tmp_path / "eval"))
  assert [(r["task"], r["split"]) for r in rows] == [(task, "dev")]
  assert rows[0]["accuracy"] == pytest.approx(results[f"{task}/dev/accuracy"])
  # The teacher's weights changed at its path (one byte of its checkpoint's largest file): the rerun
  # is refused before any checkpoint is touched (it resumed on the other teacher's logits).
  files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(teacher, "checkpoints")) for f in fs]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.seek(os.path.getsize(largest) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 1]))
  with pytest.raises(UserError, match=f"teacher={teacher} holds other weights than the teacher {tmp_path / 'a'}"):
    build_task_distillation(c, str(tmp_path / "a"))


@pytest.mark.slow
def test_teacher_logits_match_transformers(tmp_path, teachers):
  import torch
  import transformers

  from minilm_jax import runs
  from minilm_jax.devices import parallel

  task = get_task("wordnet_examples")
  examples = task.load("dev", WORDNET_SMALL).select(range(16))
  teacher = find_teachers([teachers[task.name]], [task])[task.name]
  logits = teacher_logits(teacher, task, examples, 32, 16, parallel.make_mesh(), str(tmp_path))
  runs.export_run(teachers[task.name], str(tmp_path / "hf"))
  model = transformers.BertForSequenceClassification.from_pretrained(str(tmp_path / "hf")).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
  enc = tokenizer(
    list(examples["text_a"]),
    list(examples["text_b"]),
    truncation=True,
    max_length=32,
    padding="max_length",
    return_tensors="pt",
  )
  with torch.no_grad():
    expected = model(**enc).logits.numpy()
  np.testing.assert_allclose(logits, expected, atol=1e-4)


@pytest.mark.slow
@REFINED_TEACHER_GROUP
def test_mkd_from_the_refined_teacher_reports_every_task(tmp_path, refined_teacher):
  workdir, teacher_results = refined_teacher
  assert {f"{t}/dev/accuracy" for t in TASKS} <= set(teacher_results)
  c = _student_config(",".join(TASKS), workdir)
  c.augment.enabled, c.batch_size = False, 160  # augmentation has its own test; a dozen batches per task
  run = build_task_distillation(c, str(tmp_path / "mkd"))
  assert set(run.stream.streams) == set(TASKS)
  _, results = run.run()
  for task in TASKS:
    assert 0 <= results[f"{task}/dev/accuracy"] <= 1
  metrics = [json.loads(line) for line in open(tmp_path / "mkd" / "metrics.jsonl")]
  assert all(np.isfinite(m["loss"]) for m in metrics)
  # Batch evaluation of the MKD student and of its refined teacher: every task's dev score, as in training.
  rows = evaluate_runs([str(tmp_path / "mkd"), workdir], str(tmp_path / "eval"))
  scores = {(r["run"], r["task"]): r["accuracy"] for r in rows}
  for task in TASKS:
    assert scores[(str(tmp_path / "mkd"), task)] == pytest.approx(results[f"{task}/dev/accuracy"])
    assert scores[(workdir, task)] == pytest.approx(teacher_results[f"{task}/dev/accuracy"])
  assert os.path.isfile(tmp_path / "eval" / "mkd" / f"step_{run.num_steps}" / f"{TASKS[1]}_dev_predictions.tsv")


@pytest.mark.slow
@REFINED_TEACHER_GROUP
def test_mkd_transformer_student_starts_from_the_refined_teachers_layers(tmp_path, refined_teacher):

  from minilm_jax import runs

  c = _student_config(",".join(TASKS), refined_teacher[0], kind="transformer", num_layers=2)
  c.augment.enabled = False
  run = build_task_distillation(c, str(tmp_path / "t"))
  state, _ = run.initial_state()
  teacher_encoder = runs.load_encoder(refined_teacher[0]).params  # a multi-task run lends its shared encoder
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params["body"]["encoder"]), teacher_encoder)
  # (The next test trains such a student and exports it.)


def _pretrained_encoder(path, vocabulary, **shape):
  """A random BERT saved as a pre-trained Hugging Face directory with a WordPiece vocabulary of its own."""
  import transformers

  path.mkdir()
  (path / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
  transformers.BertTokenizerFast(vocab_file=str(path / "vocab.txt")).save_pretrained(str(path))
  config = transformers.BertConfig(vocab_size=len(vocabulary), max_position_embeddings=64, **shape)
  transformers.BertModel(config).save_pretrained(str(path))
  return str(path)


@pytest.mark.slow
def test_mkd_transformer_starts_from_a_pretrained_encoder_of_another_width_and_vocabulary(
  tmp_path, refined_teacher, sentences
):
  """The thesis's MKD-Transformer: the first layers of pre-trained BERT-base under a teacher of
  another width (BERT-large). Here a 48-wide encoder with its own 400-piece vocabulary under the
  32-wide refined teacher: the student has the encoder's width, layers and vocabulary (its
  tokenizer, so that the ids are those its embeddings learnt), and trains on the teacher's logits."""
  from minilm_jax import runs

  words = sorted({w.lower().strip(".,;:'\"()") for s in sentences for w in s.split()} - {""})
  vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *list("abcdefghijklmnopqrstuvwxyz"), *words]
  vocabulary = list(dict.fromkeys(vocabulary))[:400]
  shape = dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96)
  init = _pretrained_encoder(tmp_path / "base", vocabulary, **shape)
  c = _student_config(",".join(TASKS), refined_teacher[0], kind="transformer", num_layers=2, init=init)
  c.augment.enabled = False
  run = build_task_distillation(c, str(tmp_path / "t"))
  state, _ = run.initial_state()
  encoder = jax.device_get(state.params["body"]["encoder"])
  pretrained = runs.load_encoder(init).params
  assert encoder["embeddings"]["word_embeddings"]["embedding"].shape == (len(vocabulary), 48)
  for name in encoder:  # the embeddings and the first two of its three layers
    jax.tree.map(np.testing.assert_array_equal, encoder[name], pretrained[name])
  _, results = run.run()
  assert runs.load_tokenizer_of(str(tmp_path / "t")).get_vocab() == runs.load_tokenizer_of(init).get_vocab()
  assert {f"{t}/dev/accuracy" for t in TASKS} <= set(results)
  assert all(np.isfinite(results[f"{t}/dev/loss"]) for t in TASKS)
  runs.export_run(str(tmp_path / "t"), str(tmp_path / "hf"))  # the student's 2-layer encoder, as a HF directory
  exported = runs.load_encoder(str(tmp_path / "hf")).config
  assert (exported.num_layers, exported.hidden_size, exported.vocab_size) == (2, 48, len(vocabulary))


@pytest.mark.slow
@REFINED_TEACHER_GROUP
def test_mkd_bilstm_over_single_and_pair_tasks_then_fine_tuned_per_task(tmp_path, refined_teacher, capfd):
  """Table 4.2's multi-task distilled BiLSTM (one BiLSTM for a single-sentence and a pair task),
  then MKD's last stage through the program: per task, from the student, the learning rate chosen
  by the dev loss, which is sklearn's log loss of the run's own predictions."""
  from sklearn.metrics import log_loss

  from minilm_jax.runs.reading import read_multitask_run

  teacher, _ = refined_teacher
  mkd_dir = str(tmp_path / "mkd")
  mkd = _student_config(",".join(TASKS), teacher, kind="bilstm")
  mkd.augment.enabled, mkd.batch_size = False, 200  # the teacher's logits on the originals: a minute less
  mkd_state, results = build_task_distillation(mkd, mkd_dir).run()
  assert {f"{t}/dev/{m}" for t in TASKS for m in ("accuracy", "loss")} <= set(results)
  model, params, tokenizer, tasks, joint = read_multitask_run(mkd_dir, parallel.make_mesh(2, 1))
  task = get_task("wordnet_examples")
  examples = task.load("dev", WORDNET_SMALL, "")
  features = task_features(joint, task, examples, tokenizer, 32)
  batch = {k: np.asarray(features[k]) for k in ("input_ids", "attention_mask", "input_ids_b", "attention_mask_b")}
  logits = np.asarray(model.apply({"params": params}, batch, task.name), np.float64)
  probabilities = np.exp(logits - logits.max(1, keepdims=True))
  probabilities /= probabilities.sum(1, keepdims=True)
  expected = log_loss(examples["label"], probabilities, labels=[0, 1])
  assert results["wordnet_examples/dev/loss"] == pytest.approx(expected, rel=1e-4)

  c = load_config_module(os.path.join(ROOT, "configs", "task", "mkd_finetune.py")).get_config()
  c.tasks, c.teacher, c.student.from_run = "wordnet_examples", teacher, mkd_dir
  c.data_dir, c.max_seq_length, c.epochs, c.batch_size, c.log_every = WORDNET_SMALL, 32, 1, 200, 20
  c.augment.enabled, c.mesh.data = False, 2
  # It starts from the MKD student: its block (a BiLSTM, not the config's bi-attentive LSTM), its
  # body and the task's head.
  start = build_task_distillation(c, str(tmp_path / "start"))
  assert (start.config.student.kind, start.config.student.hidden) == ("bilstm", 8)
  first = start.initial_state()[0].params
  for name in ("body", "head_wordnet_examples"):
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(first[name]), jax.device_get(mkd_state.params[name]))
  assert set(first) == {"body", "head_wordnet_examples"}
  overrides = [f"--config.{k}={v}" for k, v in (("tasks", c.tasks), ("teacher", teacher), ("data_dir", c.data_dir))]
  overrides += [f"--config.student.from_run={mkd_dir}", "--config.max_seq_length=32", "--config.epochs=1"]
  overrides += ["--config.batch_size=200", "--config.augment.enabled=false"]
  overrides += ["--config.mesh.data=2", "--config.lr_grid=1e-5,5e-5"]
  proc = run_in_process(
    "distill_task", "--config", "configs/task/mkd_finetune.py", "--workdir", tmp_path / "grid", *overrides, capfd=capfd
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  grid = json.load(open(tmp_path / "grid" / "lr_grid.json"))
  losses = {row["lr"]: row["dev_loss"] for row in grid["rows"]}
  assert set(losses) == {1e-5, 5e-5} and grid["best"]["lr"] == min(losses, key=losses.get)
  assert f"lr {grid['best']['lr']:g}" in proc.stdout
  # A finished grid reruns (in this process: the program's path is the run above): each rate's run
  # resumes at its end, the rows the same.
  grid_config = load_config_module(os.path.join(ROOT, "configs", "task", "mkd_finetune.py")).get_config()
  grid_config.tasks, grid_config.teacher, grid_config.data_dir = c.tasks, teacher, c.data_dir
  grid_config.student.from_run, grid_config.max_seq_length, grid_config.epochs = mkd_dir, 32, 1
  grid_config.batch_size, grid_config.augment.enabled, grid_config.mesh.data = 200, False, 2
  grid_config.lr_grid = "1e-5,5e-5"
  rows, _ = run_lr_grid(grid_config, str(tmp_path / "grid"))
  assert {row["lr"]: row["dev_loss"] for row in rows} == pytest.approx(losses, rel=1e-5)
  rerun = json.load(open(tmp_path / "grid" / "lr_grid.json"))
  assert {row["lr"]: row["dev_loss"] for row in rerun["rows"]} == pytest.approx(losses, rel=1e-5)
  # The one-line errors of the last stage: a student field that contradicts the run's, no run.
  c.student.hidden = 999
  with pytest.raises(UserError, match=r"student.hidden=999 contradicts student.from_run=.*hidden=8"):
    build_task_distillation(c, str(tmp_path / "e0"))
  c.student.hidden = 8
  fresh = load_config_module(os.path.join(ROOT, "configs", "task", "mkd_finetune.py")).get_config()
  with pytest.raises(UserError, match="student.from_run is required"):
    build_task_distillation(fresh, str(tmp_path / "e3"))
  c.student.from_run = teacher
  with pytest.raises(UserError, match="is not a task-distillation run's workdir"):
    build_task_distillation(c, str(tmp_path / "e1"))
  c.student.from_run, c.tasks = mkd_dir, "sst2"
  with pytest.raises(UserError, match="has no head for sst2"):
    build_task_distillation(c, str(tmp_path / "e2"))


@pytest.mark.slow
def test_hard_label_student_needs_no_teacher_logits(tmp_path, teachers):
  c = _student_config("wordnet_examples", teachers["wordnet_supersense"], kind="siamese_bilstm")
  c.objective = "hard"  # gold labels: the supersense run only lends its tokenizer
  run = build_task_distillation(c, str(tmp_path / "h"))
  assert len(run.stream.streams["wordnet_examples"].rows) == WORDNET_SMALL_TRAIN["wordnet_examples"]  # no augmentation
  assert "wordnet_examples/dev/accuracy" in run.run()[1]


@pytest.mark.slow
def test_glue_student_is_evaluated_with_submission_files_by_the_program(tmp_path, tiny_teacher, sst2_dir):
  """`python -m minilm_jax.evaluate` on a BiLSTM student of SST-2: dev accuracy and the GLUE server's SST-2.tsv."""
  c = _student_config("sst2", tiny_teacher)  # gold labels: the tiny teacher only lends its tokenizer
  c.objective, c.data_dir, c.batch_size = "hard", sst2_dir, 16
  _, results = build_task_distillation(c, str(tmp_path / "student")).run()
  out = tmp_path / "eval"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "minilm_jax.evaluate",
      "--runs",
      str(tmp_path / "student"),
      "--out",
      str(out),
      "--eval_batch_size",
      "16",
    ],
    capture_output=True,
    text=True,
    cwd=ROOT,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  (row,) = json.load(open(out / "metrics.json"))
  assert (row["task"], row["split"]) == ("sst2", "dev") and row["accuracy"] == pytest.approx(
    results["sst2/dev/accuracy"]
  )
  (step,) = os.listdir(out / "student")
  submission = (out / "student" / step / "SST-2.tsv").read_text().splitlines()
  assert submission[0] == "index\tprediction" and len(submission) == 17
  assert all(line.split("\t")[1] in ("0", "1") for line in submission[1:])


@pytest.mark.slow
def test_one_line_errors(tmp_path, teachers):
  c = _student_config("wordnet_examples", teachers["wordnet_supersense"])
  with pytest.raises(UserError, match="task wordnet_examples has no teacher"):
    build_task_distillation(c, str(tmp_path / "e1"))
  c = _student_config("wordnet_supersense", "")
  with pytest.raises(UserError, match="config.teacher is empty"):
    build_task_distillation(c, str(tmp_path / "e4"))
  c = _student_config("squad2", teachers["wordnet_supersense"])
  with pytest.raises(UserError, match="squad2 is not a sentence"):
    build_task_distillation(c, str(tmp_path / "e5"))


@pytest.mark.slow
def test_program_reports_bad_input_in_one_line(tmp_path, teachers):
  proc = run_distill_task(
    "configs/task/distilled_bilstm.py",
    tmp_path / "w",
    "--config.tasks=wordnet_examples",
    f"--config.teacher={teachers['wordnet_supersense']}",
  )
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: task wordnet_examples has no teacher")


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "configs", "task"))))
def test_every_task_config_builds(name):
  import jax
  import jax.numpy as jnp

  from minilm_jax.models.encoder import EncoderConfig
  from minilm_jax.models.students import make_student

  config = load_config_module(os.path.join(ROOT, "configs", "task", name)).get_config()
  if left_to_run(config.student):  # MKD's last stage: the student is the one of student.from_run
    assert "from_run" in config.student
    return
  tasks = [get_task(t) for t in config.tasks.split(",")]
  model = make_student(config.student, tuple((t.name, t.head()["num_labels"]) for t in tasks), 30522, EncoderConfig())
  batch = {k: jnp.ones((2, 8), jnp.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
  pair = {**batch, "input_ids_b": batch["input_ids"], "attention_mask_b": batch["attention_mask"]}
  batches = {t.name: pair if len(t.text_columns) > 1 else batch for t in tasks}
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batches))["params"]
  assert {f"head_{t.name}" for t in tasks} <= set(shapes)


def test_a_grid_over_other_rates_adds_to_the_earlier_one(tmp_path):
  """`lr_grid.json` is merged, never replaced: a later grid's rates replace only their own rows, the
  best is chosen over them all, and a file that is not a grid is refused before it is touched."""
  from minilm_jax.cli.outputs import write_json
  from minilm_jax.task_distill.run import merge_grid, read_grid

  path = str(tmp_path / "lr_grid.json")
  write_json(path, {"rows": [{"lr": 1e-5, "dev_loss": 0.4}, {"lr": 5e-5, "dev_loss": 0.3}], "best": {}})
  rows, best = merge_grid(read_grid(path), [{"lr": 2e-5, "dev_loss": 0.35}, {"lr": 5e-5, "dev_loss": 0.5}])
  assert [(r["lr"], r["dev_loss"]) for r in rows] == [(1e-5, 0.4), (2e-5, 0.35), (5e-5, 0.5)] and best == 1
  assert merge_grid(read_grid(str(tmp_path / "none.json")), rows[:1]) == (rows[:1], 0)
  (tmp_path / "notes.json").write_text('["mine"]')
  with pytest.raises(UserError, match="is not a learning-rate grid this program wrote"):
    read_grid(str(tmp_path / "notes.json"))
  assert (tmp_path / "notes.json").read_text() == '["mine"]'
  c = task_distillation_config()
  c.lr_grid = "1e-5,5e-5,1e-05"
  with pytest.raises(UserError, match="names a learning rate twice"):
    run_lr_grid(c, str(tmp_path / "grid"))
  assert not os.path.exists(tmp_path / "grid")


def _distilling_config(init, teacher, task="wordnet_supersense", **distill):
  c = _finetune_config(init, task)
  c.distill.teacher = teacher
  for k, v in distill.items():
    setattr(c.distill, k, v)
  return c


@pytest.mark.slow
def test_finetuning_distils_a_teachers_logits_and_layers_on_augmented_data(tmp_path, teachers, tiny_teacher):
  """The second stage (`distill.teacher`): a fine-tuning run on the teacher's logits over the
  augmented training set, plus TinyBERT's layer objective against the teacher run inside the step
  (on 2 of the fake devices); its loss is the logit MSE computed here in numpy plus the layer terms
  of the distillation objective, and the result is a fine-tuning run like any other."""
  task = "wordnet_supersense"
  c = _distilling_config(tiny_teacher, teachers[task], layers="tinybert_layerwise", layers_weight=0.5)
  c.augment.enabled, c.augment.size_factor, c.augment.n_iter = True, 2, 3
  run = build_finetuning(c, str(tmp_path / "kd"))
  rows = run.stream.rows
  assert (
    WORDNET_SMALL_TRAIN[task] < len(rows) <= 2 * WORDNET_SMALL_TRAIN[task] and "teacher_logits" in rows.column_names
  )
  # The targets are the teacher run's logits on those (augmented) texts.
  examples = augment.augmented(
    get_task(task).load("train", WORDNET_SMALL), "[MASK]", c.augment, str(tmp_path / "kd" / "cache"), ""
  )
  teacher = find_teachers([teachers[task]], [get_task(task)])[task]
  expected = teacher_logits(teacher, get_task(task), examples, 32, 128, run.mesh, str(tmp_path / "kd" / "cache"))
  np.testing.assert_allclose(np.asarray(rows["teacher_logits"]), expected, rtol=1e-6)
  # The step's loss on a batch, deterministic parts checked: with dropout off the loss is the logit
  # MSE (numpy) plus half the layer terms of the objective on separate forward passes.
  state, _ = run.initial_state()
  batch = {k: np.asarray(rows[:8][k]) for k in ("input_ids", "attention_mask", "token_type_ids", "teacher_logits")}
  quiet = build_finetuning(_quiet(c), str(tmp_path / "quiet"))
  loss = distillation_loss(quiet.teacher, quiet.step.model, get_task(task))(
    state.params, batch, {"dropout": jax.random.key(0)}, quiet.teacher.params
  )
  logits = np.asarray(apply_model(quiet.step.model, state.params, batch))
  mse = np.mean(np.sum((logits - batch["teacher_logits"]) ** 2, axis=-1))
  layers = quiet.teacher.layers
  student_config = runs.encoder_config_of(tiny_teacher)
  student = layers.outputs(Encoder(student_config), state.params["encoder"], batch, student_config.num_layers)
  teacher_out = layers.outputs(quiet.teacher.encoder, quiet.teacher.params, batch, layers.teacher_layers_needed)
  terms = layers(teacher_out, Outputs(student.layers, None, student.embeddings), batch, {})
  assert set(terms) == {"embeddings_mse", *(f"{k}@{i}" for i in range(2) for k in ("attention_mse", "hidden_mse"))}
  assert float(loss) == pytest.approx(mse + 0.5 * float(sum(jnp.asarray(v) for v in terms.values())), rel=1e-5)
  # It trains and is a fine-tuning run: evaluated again from its checkpoint, and exported.
  _, results = run.run()
  rows_eval = evaluate_runs([str(tmp_path / "kd")], str(tmp_path / "eval"))
  assert rows_eval[0]["accuracy"] == pytest.approx(results["dev/accuracy"])
  runs.export_run(str(tmp_path / "kd"), str(tmp_path / "hf"))
  assert os.path.isfile(tmp_path / "hf" / "config.json")


@pytest.mark.slow
def test_a_distilling_grid_with_seeds_augments_and_labels_once(tmp_path, teachers, tiny_teacher, monkeypatch):
  """`--grid` with seeds over a second stage: every run learns the teacher's logits on the same
  augmented set, augmented and labelled once in the grid's cache."""
  from minilm_jax.finetuning.grid import run_grid

  task = "wordnet_supersense"
  c = _distilling_config(tiny_teacher, teachers[task])
  c.augment.enabled, c.augment.size_factor, c.augment.n_iter = True, 2, 3
  c.grid.lrs, c.grid.epochs, c.seeds = (1e-3,), (1,), 2
  tagged = []
  real_tagger = augment.load_pos_tagger
  monkeypatch.setattr(augment, "load_pos_tagger", lambda: tagged.append(1) or real_tagger())
  rows, _ = run_grid(c, str(tmp_path))
  assert rows[0]["seeds"] == 2 and 0 <= rows[0]["dev/accuracy"] <= 1 and len(tagged) == 1
  cached = sorted(os.path.splitext(name)[1] for name in os.listdir(tmp_path / "cache"))
  assert cached == [".npy", ".parquet"]


def _custom_teacher(tmp_path, init, name: str, labels: tuple) -> str:
  """A teacher fine-tuned for one epoch on a small CSV task of the given class names."""
  import csv

  for split in ("train", "dev"):
    with open(tmp_path / f"{name}_{split}.csv", "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["text", "label"])
      writer.writerows([f"line {i} says {labels[i % 2]}", labels[i % 2]] for i in range(32))
  c = _finetune_config(init, "custom")
  c.data.train, c.data.dev = str(tmp_path / f"{name}_train.csv"), str(tmp_path / f"{name}_dev.csv")
  c.data_dir, c.batch_size = "", 32  # its 32 rows: one batch
  build_finetuning(c, str(tmp_path / name)).run()
  return str(tmp_path / name)


@pytest.mark.slow
def test_several_teachers_are_learnt_as_the_mean_of_their_logits(
  tmp_path, teachers, tiny_teacher, tiny_teacher_bert_vocab
):
  """`distill.teacher` a comma list (the teacher fine-tuned with two seeds): the targets are the
  mean of each teacher's own logits, the layers are the first teacher's; teachers of another task,
  of other labels or of another vocabulary, and one named twice, are one line each."""
  task = get_task("wordnet_supersense")
  seed_1 = str(tmp_path / "teacher_seed_1")
  c = _finetune_config(tiny_teacher, task.name)
  c.seed = 1
  build_finetuning(c, seed_1).run()
  both = f"{teachers[task.name]},{seed_1}"
  run = build_finetuning(_distilling_config(tiny_teacher, both, layers="tinybert_layerwise"), str(tmp_path / "kd"))
  examples = task.load("train", WORDNET_SMALL)
  each = [
    teacher_logits(
      find_teachers([t], [task])[task.name], task, examples, 32, 128, run.mesh, str(tmp_path / "kd" / "cache")
    )
    for t in (teachers[task.name], seed_1)
  ]
  assert np.abs(each[0] - each[1]).max() > 1e-2  # two teachers that differ
  np.testing.assert_allclose(np.asarray(run.stream.rows["teacher_logits"]), np.mean(each, axis=0), rtol=1e-6)
  assert [r.path for r in run.teacher.runs] == [teachers[task.name], seed_1]
  first = runs.read_run(teachers[task.name]).params["encoder"]
  np.testing.assert_array_equal(
    np.asarray(run.teacher.params["embeddings"]["word_embeddings"]["embedding"]),
    np.asarray(first["embeddings"]["word_embeddings"]["embedding"]),
  )
  cases = [
    (
      f"{teachers[task.name]},{teachers['wordnet_examples']}",
      "task wordnet_supersense has no teacher: none of teacher=",
    ),
    (f"{seed_1},{seed_1}", "names one run twice"),
  ]
  for i, (teacher, message) in enumerate(cases):
    with pytest.raises(UserError, match=message):
      build_finetuning(_distilling_config(tiny_teacher, teacher), str(tmp_path / f"bad_{i}"))
  # Other labels, another vocabulary: teachers of the user's own task.
  yes_no = _custom_teacher(tmp_path, tiny_teacher, "yes_no", ("no", "yes"))
  cases = [
    (
      _custom_teacher(tmp_path, tiny_teacher, "yes_maybe", ("maybe", "yes")),
      "predicts \\['maybe', 'yes'\\] for custom",
    ),
    (_custom_teacher(tmp_path, tiny_teacher_bert_vocab, "yes_no_bert", ("no", "yes")), "has another vocabulary"),
  ]
  student = _finetune_config(tiny_teacher, "custom")
  student.data.train, student.data.dev, student.data_dir = (
    str(tmp_path / "yes_no_train.csv"),
    str(tmp_path / "yes_no_dev.csv"),
    "",
  )
  for i, (other, message) in enumerate(cases):
    student.distill.teacher = f"{yes_no},{other}"
    with pytest.raises(UserError, match=message):
      build_finetuning(student, str(tmp_path / f"custom_bad_{i}"))


def _quiet(c):
  """`c` with dropout off."""
  q = c.copy_and_resolve_references()
  q.dropout = 0.0
  return q


def test_distilling_settings_contradicting_the_run_are_one_line(tmp_path, teachers, tiny_teacher, minilm_dir):
  """Augmentation or layers without a teacher, a teacher of another task, the gold-label objective
  with a teacher, layers of another width, layers no objective names: each a one-line error before
  any compute."""
  task = "wordnet_supersense"
  cases = []
  c = _finetune_config(tiny_teacher, task)
  c.augment.enabled = True
  cases.append((c, "augment.enabled needs distill.teacher"))
  c = _finetune_config(tiny_teacher, task)
  c.distill.layers = "tinybert_layerwise"
  cases.append((c, "distill.layers needs distill.teacher"))
  cases.append((_distilling_config(tiny_teacher, teachers["wordnet_examples"]), "has no teacher"))
  cases.append((_distilling_config(tiny_teacher, teachers[task], objective="hard"), "leave distill.teacher empty"))
  c = _distilling_config(minilm_dir, teachers[task], layers="tinybert_layerwise")
  cases.append((c, "learnt maps between widths are not kept"))
  c = _distilling_config(tiny_teacher, teachers[task], layers="nosuch")  # named as the user named it
  cases.append((c, "distill.layers='nosuch' is no distillation objective: use one of .*tinybert_layerwise"))
  for i, (config, message) in enumerate(cases):
    with pytest.raises(UserError, match=message):
      build_finetuning(config, str(tmp_path / str(i)))


@pytest.mark.slow
def test_a_teacher_is_reused_by_its_content_and_named_once_however_it_is_written(tmp_path, tiny_teacher, monkeypatch):
  """The second stage's teacher logits are cached by the teacher's checkpoint content: a teacher run
  rebuilt at the same path (another seed) is labelled again, not read from the shared cache, and
  the second stage that learnt the first one does not resume on it; a teacher rewritten while its
  weights are read is refused, its logits never cached; the same run named through a trailing
  slash, a symlink or another real path holding its bytes (a bind mount) is one teacher named
  twice; `,` names none; a teacher still being written (its
  workdir's lock held by a running program) is refused before any work."""
  task = get_task("wordnet_supersense")
  teacher, cache = str(tmp_path / "teacher"), str(tmp_path / "shared_cache")
  student = _distilling_config(tiny_teacher, teacher)
  student.distill.cache_dir = cache

  def labelled(seed, run=False):
    c = _finetune_config(tiny_teacher, task.name)
    c.seed = seed
    shutil.rmtree(teacher, ignore_errors=True)
    build_finetuning(c, teacher).run()
    second_stage = build_finetuning(student, str(tmp_path / f"kd_{seed}"))
    if run:
      second_stage.run()
    return np.asarray(second_stage.stream.rows["teacher_logits"])

  first, rebuilt = labelled(0, run=True), labelled(1)
  assert np.abs(first - rebuilt).max() > 1e-2  # the rebuilt teacher's own logits, not the first's
  resumed = f"distill.teacher={teacher} holds other weights than the teacher {tmp_path / 'kd_0'} started from"
  with pytest.raises(UserError, match=re.escape(resumed)):
    build_finetuning(student, str(tmp_path / "kd_0"))
  read_as = iter(["before the read", "after it"])
  with monkeypatch.context() as patched:
    patched.setattr(TeacherRun, "content_digest", lambda self: next(read_as))
    with pytest.raises(UserError, match=f"teacher {teacher} changed while its weights were read"):
      teacher_logits(
        find_teachers([teacher], [task])[task.name], task, task.load("train", WORDNET_SMALL), 32, 128,
        parallel.make_mesh(2), str(tmp_path / "raced_cache"),
      )  # fmt: skip
  assert not os.path.exists(tmp_path / "raced_cache")
  fresh = teacher_logits(
    find_teachers([teacher], [task])[task.name],
    task,
    task.load("train", WORDNET_SMALL),
    32,
    128,
    parallel.make_mesh(2),
    str(tmp_path / "own_cache"),
  )
  np.testing.assert_allclose(rebuilt, fresh, rtol=1e-6)
  os.symlink(teacher, tmp_path / "link")
  shutil.copytree(teacher, tmp_path / "mounted")  # as a bind mount shows it: another real path, the same bytes
  for i, (names, message) in enumerate(
    [
      (f"{teacher},{tmp_path / 'mounted'}", f"names one run twice: {teacher} and {tmp_path / 'mounted'} hold the same"),
      (f"{teacher},{teacher}/", f"names one run twice \\({teacher} and {teacher}/\\)"),
      (f"{teacher},{tmp_path / 'link'}", f"names one run twice \\({teacher} and {tmp_path / 'link'}\\)"),
      (",", "names no run"),
    ]
  ):
    with pytest.raises(UserError, match=message):
      build_finetuning(_distilling_config(tiny_teacher, names), str(tmp_path / f"bad_{i}"))
  writer = subprocess.Popen(
    [sys.executable, "-c", f"from minilm_jax.runs import lock; lock.hold({teacher!r}); import time; time.sleep(60)"]
  )
  try:
    deadline = time.time() + 30
    while lock.holder(teacher) is None and time.time() < deadline:
      time.sleep(0.2)
    with pytest.raises(UserError, match=f"teacher {teacher} is still being written by .*pid {writer.pid}"):
      build_finetuning(_distilling_config(tiny_teacher, teacher), str(tmp_path / "kd_while_training"))
  finally:
    writer.kill()
    writer.wait()
  assert lock.holder(teacher) is None


def test_a_teacher_folder_whose_name_holds_a_comma_is_one_line(tmp_path, tiny_teacher):
  """`distill.teacher` and task distillation's `teacher` are comma lists: a folder named `ft,seed1`
  would be split into two teachers neither of which exists; one line says how to name it, before
  any work."""
  folder = tmp_path / "ft,seed1"
  folder.mkdir()
  message = "is one folder whose name holds a comma, which separates teachers in"
  with pytest.raises(UserError, match=f"distill.teacher=.* {message} distill.teacher: rename it"):
    build_finetuning(_distilling_config(tiny_teacher, str(folder)), str(tmp_path / "kd"))
  with pytest.raises(UserError, match=f"teacher=.* {message} teacher: rename it"):
    build_task_distillation(_student_config("wordnet_supersense", str(folder)), str(tmp_path / "student"))
  assert not (tmp_path / "kd").exists() and not (tmp_path / "student").exists()
