"""The distillation trainer: data-parallel step, resume, preemption, configs and bad input."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest
from flax import traverse_util

from conftest import (
  ROOT,
  WORDNET_SMALL,
  count_checkpoint_openings,
  load_config_module,
  output_lines,
  read_metrics,
  run_in_process,
  tiny_config,
  train_command,
  xla_flags,
)
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.distill.step import student_config
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.evaluation.evaluators import evaluator
from minilm_jax.models.encoder import Encoder, abstract_params


def _final_params(workdir):
  return runs.read_run(workdir).params


@pytest.mark.slow
def test_data_parallel_step_equals_single_device(tiny_teacher_bert_vocab, tiny_corpus, tmp_path):
  """8 devices (batch split 8 ways, explicit gradient mean) against 1 device, 3 steps. Adam hides a
  constant gradient scale in the update, so the gradient norms are compared too: they catch a
  gradient summed over devices instead of averaged."""
  results = {}
  for n in (1, 8):
    workdir = str(tmp_path / f"devices{n}")
    run = build_distillation(tiny_config(tiny_teacher_bert_vocab, tiny_corpus, **{"mesh.data": n}), workdir)
    assert run.mesh.shape == {"data": n, "model": 1}  # the config's mesh.data
    state = run.run()
    results[n] = (jax.device_get(state.params), read_metrics(workdir))
  (single, single_metrics), (sharded, sharded_metrics) = results[1], results[8]
  single, sharded = (traverse_util.flatten_dict(p, sep="/") for p in (single, sharded))
  for name in single:
    # A key bias adds q.b to every key's score, which softmax ignores: its exact gradient is 0, and
    # Adam scales the rounding noise it does get (which differs with the reduction order) to
    # learning-rate-sized steps. Every other parameter must agree.
    if not name.endswith("attention/key/bias"):
      np.testing.assert_allclose(single[name], sharded[name], atol=2e-6, rtol=1e-5, err_msg=name)
  assert [m["step"] for m in sharded_metrics] == [1, 2, 3]
  for a, b in zip(single_metrics, sharded_metrics):
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-4)
  assert single_metrics[-1]["loss"] < single_metrics[0]["loss"]


def test_a_mesh_beyond_the_devices_or_leaving_out_a_process_is_one_line(tiny_teacher, tiny_corpus, tmp_path):
  workdir = str(tmp_path / "w")
  with pytest.raises(UserError, match=r"^mesh asks for 16 x 1 devices but 8 are available: use -1 for all$"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"mesh.data": 16}), workdir)
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
  # Two processes of 4 devices each: a mesh of 2 would leave the second process's share of every batch nowhere.
  devices = [types.SimpleNamespace(process_index=i // 4) for i in range(8)]
  with pytest.raises(UserError, match=r"2 x 1 of the 8 devices of 2 processes: .* uses them all \(mesh.data=-1\)"):
    parallel.make_mesh(2, 1, devices)


def test_bfloat16_step_runs_with_float32_state(tiny_teacher, tiny_corpus, tmp_path):
  config = tiny_config(tiny_teacher, tiny_corpus, dtype="bfloat16", num_steps=2)
  run = build_distillation(config, str(tmp_path / "bf16"))
  state = run.run()
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(state.params))
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(state.opt_state) if x.ndim)
  assert np.isfinite(read_metrics(str(tmp_path / "bf16"))[-1]["loss"])


def _env(tiny_teacher, tiny_corpus):
  env = dict(
    os.environ,
    TINY_TEACHER=tiny_teacher,
    TINY_CORPUS=tiny_corpus,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.path.join(ROOT, "tests"),
  )
  env["XLA_FLAGS"] = xla_flags(2)
  return env


def _wait_for(predicate, proc, timeout=120):
  deadline = time.time() + timeout
  while not predicate():
    assert proc.poll() is None, f"training exited early: {proc.stderr.read()[-2000:]}"
    assert time.time() < deadline, "timed out waiting for the run"
    time.sleep(0.05)


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_exactly(tiny_teacher, tiny_corpus, tmp_path, monkeypatch, capfd):
  env = _env(tiny_teacher, tiny_corpus)
  steps = ["--config.num_steps=30", "--config.checkpoint.every=5"]
  straight = str(tmp_path / "straight")  # run in this process, the killed one in its own
  assert _train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, straight, *steps).returncode == 0

  killed = str(tmp_path / "killed")
  proc = subprocess.Popen(
    train_command(killed, *steps), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  _wait_for(lambda: glob.glob(os.path.join(killed, "checkpoints", "1[05]")), proc)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  interrupted_at = runs.RunCheckpoints(killed, read_only=True).latest_step()
  assert interrupted_at is not None and interrupted_at < 30
  rerun = subprocess.run(train_command(killed, *steps), env=env, check=True, capture_output=True, text=True)
  # The killed run's lock (its record left in the workdir, its flock gone with the process) is taken over.
  assert f"taking over the lock of train (pid {proc.pid} on " in rerun.stderr
  assert not os.path.exists(os.path.join(killed, "run.lock"))  # let go when the run ended

  a, b = read_metrics(straight), read_metrics(killed)
  assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 31))
  # Same batches in the same order: every step's loss is the uninterrupted run's.
  np.testing.assert_allclose([m["loss"] for m in b], [m["loss"] for m in a], rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), _final_params(straight), _final_params(killed))


@pytest.mark.slow
def test_a_second_program_on_a_running_workdir_is_refused_and_the_first_ends_as_alone(
  tiny_teacher, tiny_corpus, tmp_path, monkeypatch, capfd
):
  """Two `train` programs on one workdir (a requeued job, a launch script's typo): the second exits 2
  with one line naming the first, before any work, and the first ends as a run alone does. The
  first is held still (SIGSTOP) while the second starts, so that it is surely running then."""
  env = _env(tiny_teacher, tiny_corpus)
  steps = ["--config.num_steps=12", "--config.checkpoint.every=4"]
  alone = str(tmp_path / "alone")  # this one and the second in this process
  assert _train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, alone, *steps).returncode == 0
  workdir = str(tmp_path / "shared")
  first = subprocess.Popen(train_command(workdir, *steps), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  metrics = os.path.join(workdir, "metrics.jsonl")
  _wait_for(lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0, first)
  first.send_signal(signal.SIGSTOP)
  try:
    second = _train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, workdir, *steps)
  finally:
    first.send_signal(signal.SIGCONT)
  lines = output_lines(second.stderr)
  assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
  assert lines[0].startswith(f"error: --workdir {workdir} is in use by train (pid {first.pid} on "), lines[0]
  assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
  a, b = read_metrics(alone), read_metrics(workdir)
  assert [m["step"] for m in a] == [m["step"] for m in b] == list(range(1, 13))
  np.testing.assert_allclose([m["loss"] for m in b], [m["loss"] for m in a], rtol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), _final_params(alone), _final_params(workdir))


@pytest.mark.slow
def test_sigterm_saves_the_step_it_was_on(tiny_teacher, tiny_corpus, tmp_path):
  workdir = str(tmp_path / "term")
  proc = subprocess.Popen(
    train_command(workdir, "--config.num_steps=100000", "--config.checkpoint.every=100000"),
    env=_env(tiny_teacher, tiny_corpus),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  metrics = os.path.join(workdir, "metrics.jsonl")
  _wait_for(lambda: os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3, proc)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err[-2000:]  # preempted, not finished: a scheduler reruns it
  assert "preempted: SIGTERM: saved the checkpoint of step" in err
  last_logged = read_metrics(workdir)[-1]["step"]
  saved = runs.RunCheckpoints(workdir, read_only=True).latest_step()
  assert saved == last_logged and saved < 100000


@pytest.mark.slow
def test_teacher_can_be_an_earlier_run(tiny_teacher, tiny_corpus, tmp_path, monkeypatch):
  """Teacher-assistant chain: teacher -> assistant (a run) -> student, the assistant read from its
  workdir, its checkpoints opened once for the whole run: its weights, its record and the Dense map
  of its sentence embeddings (learnt by the embedding objective), which the evaluators at two
  lengths apply to its embeddings."""
  assistant = str(tmp_path / "assistant")
  build_distillation(
    tiny_config(tiny_teacher, tiny_corpus, **{"student.num_layers": 2, "loss.embedding_weight": 1.0}), assistant
  ).run()
  assistant_params = _final_params(assistant)
  config = tiny_config(assistant, tiny_corpus, **{"student.num_layers": 1, "student.hidden_size": 8})
  opened = count_checkpoint_openings(monkeypatch)
  for name, length in (("short", 16), ("long", 32)):
    config.evaluators[name] = evaluator("retrieval", 3, data_dir=WORDNET_SMALL, max_seq_length=length)
  student = build_distillation(config, str(tmp_path / "student"))
  assert student.train_step.teacher.config.hidden_size == 16 and student.train_step.teacher.config.num_layers == 2
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(student.lone.teacher_params), assistant_params)
  student.run()
  assert opened.count(os.path.abspath(assistant)) == 1, opened
  teacher_rows = [m for m in read_metrics(str(tmp_path / "student")) if "eval/short/teacher/mrr@10" in m]
  assert teacher_rows, "the evaluators scored the teacher"


def _config_cases():
  """(file, variant) of every distillation config: configs/*.py, and each variant of configs/ablations/*.py."""
  cases = [(p, None) for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))]
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "ablations", "*.py"))):
    cases += [(path, v) for v in load_config_module(path).VARIANTS]
  return cases


@pytest.mark.parametrize(
  "path,variant", _config_cases(), ids=lambda x: os.path.basename(x) if x and "/" in x else str(x)
)
def test_every_config_builds(path, variant):
  """Each config's student (each student of a family config) fits a teacher of the paper's shape."""
  from minilm_jax.distill import family

  module = load_config_module(path)
  config = module.get_config() if variant is None else module.get_config(variant)
  for student in family.members(config).values():
    _check_builds(student)


def _check_builds(config):
  student = student_config(config)
  shapes = abstract_params(student)
  assert shapes["layer_0"]["attention"]["query"]["kernel"].shape == (config.student.hidden_size,) * 2
  assert f"layer_{config.student.num_layers - 1}" in shapes
  from minilm_jax.distill import etd
  from minilm_jax.transfer import relations
  from minilm_jax.transfer.objectives import make_objective

  relations.check_relation_heads(config.loss.num_relation_heads, config.student.hidden_size)
  # The objective and (for ETD) the extraction must fit a teacher of the paper's shape.
  teacher = student.replace(num_layers=12, hidden_size=768, intermediate_size=3072)
  make_objective(config.loss, teacher, student, 11, student.num_layers - 1)
  if config.student.init == "etd":
    etd.check_extractable(teacher, student)
    etd.select_layers(12, student.num_layers, config.etd.layers)
  assert config.teacher.path and config.batch_size > 0 and (config.num_steps > 0 or config.data.epochs > 0)


def test_teacher_assistant_chains_name_the_configs_that_train_their_assistants():
  """A config whose teacher is `workdirs/<name>` (MiniLM section 3.3, and section 5.3's multilingual
  6x384) distils from the run of `configs/<name>.py`: that config exists, its student has the
  teacher's depth-12 and the student's width, and the same model type and vocabulary."""
  chains = 0
  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py"))):
    config = load_config_module(path).get_config()
    if not config.teacher.path.startswith("workdirs/"):
      continue
    chains += 1
    assistant = load_config_module(os.path.join(ROOT, "configs", config.teacher.path[9:] + ".py")).get_config()
    s, a = config.student, assistant.student
    assert (a.num_layers, a.hidden_size, a.model_type, a.vocab_size) == (12, s.hidden_size, s.model_type, s.vocab_size)
    assert assistant.teacher.path in ("bert-base-uncased", "xlm-roberta-base")
  assert chains == 2  # minilm_6x384_from_ta.py and multilingual_6x384.py


def _one_line_error(proc):
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, proc.stderr[-2000:]
  return lines[0]


def _train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, workdir, *overrides):
  """`train` on tests/tiny_config.py in this process (the config reads its teacher and corpus from
  the environment)."""
  monkeypatch.setenv("TINY_TEACHER", tiny_teacher)
  monkeypatch.setenv("TINY_CORPUS", tiny_corpus)
  return run_in_process("train", *train_command(workdir, *overrides)[3:], capfd=capfd)


def test_cli_unknown_config_field(tiny_teacher, tiny_corpus, tmp_path, monkeypatch, capfd):
  line = _one_line_error(
    _train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, str(tmp_path / "w"), "--config.optimizer.nope=1")
  )
  assert "nope" in line


def test_cli_missing_teacher(tiny_teacher, tiny_corpus, tmp_path, monkeypatch, capfd):
  missing = f"--config.teacher.path={tmp_path}/missing"
  line = _one_line_error(_train_in_process(tiny_teacher, tiny_corpus, monkeypatch, capfd, str(tmp_path / "w"), missing))
  assert "does not exist" in line and "missing" in line
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_an_unreadable_gpu_memory_share_is_one_line(tiny_teacher, tiny_corpus, tmp_path):
  """XLA_PYTHON_CLIENT_MEM_FRACTION that JAX's CUDA plugin cannot read (installed here by the aot
  extra, whose registration printed a traceback) is the whole of stderr: one line, exit 2."""
  env = dict(_env(tiny_teacher, tiny_corpus), XLA_PYTHON_CLIENT_MEM_FRACTION="abc")
  proc = subprocess.run(train_command(str(tmp_path / "w")), env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
  assert "XLA_PYTHON_CLIENT_MEM_FRACTION='abc' is not a share of the GPU's memory" in proc.stderr
  assert not os.path.exists(tmp_path / "w")


def test_resuming_with_another_config_is_refused_before_writing(tiny_teacher, tiny_corpus, tmp_path):
  """Only a run's length, logging, checkpointing and device layout may change when it resumes."""
  workdir = str(tmp_path / "w")
  build_distillation(tiny_config(tiny_teacher, tiny_corpus, num_steps=1), workdir).run()
  before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(workdir, "**"), recursive=True)}
  for change, shown in (
    ({"student.hidden_size": 8}, "student.hidden_size: 16 -> 8"),
    ({"seed": 3}, "seed: 0 -> 3"),
    ({"optimizer.lr": 1.0, "data.max_seq_length": 16}, "data.max_seq_length: 32 -> 16, optimizer.lr"),
  ):
    with pytest.raises(UserError, match=f"holds a run started with another config \\({shown}"):
      build_distillation(tiny_config(tiny_teacher, tiny_corpus, num_steps=2, **change), workdir)
  assert {p: os.path.getmtime(p) for p in glob.glob(os.path.join(workdir, "**"), recursive=True)} == before
  build_distillation(
    tiny_config(tiny_teacher, tiny_corpus, num_steps=2, log_every=2, **{"checkpoint.every": 2}), workdir
  ).run()
  assert runs.RunCheckpoints(workdir, read_only=True).latest_step() == 2


def test_resuming_from_a_teacher_rebuilt_at_its_path_is_refused_before_writing(tiny_teacher, tiny_corpus, tmp_path):
  """A teacher is known by the digest of its weights, which the record keeps: the same teacher at
  another path (another checkout or venv) resumes the run, and one retrained or rebuilt at its path
  is refused."""
  import torch
  import transformers

  first, teacher, workdir = str(tmp_path / "first"), str(tmp_path / "teacher"), str(tmp_path / "w")
  shutil.copytree(tiny_teacher, first)
  build_distillation(tiny_config(first, tiny_corpus, num_steps=1), workdir).run()
  assert len(runs.read_record(workdir).teacher_weights) == 64
  shutil.copytree(first, teacher)
  build_distillation(tiny_config(teacher, tiny_corpus, num_steps=2, log_every=2), workdir).run()
  assert runs.RunCheckpoints(workdir, read_only=True).latest_step() == 2
  model = transformers.BertModel.from_pretrained(teacher)
  with torch.no_grad():
    model.embeddings.word_embeddings.weight[5] += 0.01  # one row of one matrix: retrained a little
  model.save_pretrained(teacher)
  checkpoints = os.path.join(workdir, "checkpoints")
  before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(checkpoints, "**"), recursive=True)}
  with pytest.raises(
    UserError, match=f"teacher.path={teacher} holds other weights than the teacher {workdir} started from"
  ):
    build_distillation(tiny_config(teacher, tiny_corpus, num_steps=3), workdir)
  assert {p: os.path.getmtime(p) for p in glob.glob(os.path.join(checkpoints, "**"), recursive=True)} == before
  assert not os.path.exists(os.path.join(workdir, "run.lock"))  # released: the workdir is free again


# What a newcomer must never see first: the accelerator plugins' start-up lines (the `aot` extra puts
# jax's CUDA plugin and libtpu into the environment), a plugin's traceback, any traceback.
_PLUGIN_LINES = (
  "cudart_stub",
  "absl::InitializeLog",
  "InitGoogle",
  "Jax plugin configuration error",
  "Traceback",
  "TPU",
  "host bounds",
  "Unable to load CUDA",
)


@pytest.mark.slow
def test_demo_config_runs_through_the_cli(tmp_path, minilm_dir, capfd):
  """The README's main job, shortened: the real teacher, the harvested corpus, the real program,
  its evaluators (on small files instead of WordNet's thousands of sentences) and its closing table;
  started the README's way: no JAX_PLATFORMS and no device-count flag in the environment (the
  suite's conftest sets both), with whatever plugins CI's install put there. Every line on stderr
  is the program's own: its progress bars, the datasets library's, and nothing a plugin printed."""
  workdir = str(tmp_path / "demo")
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("a domestic animal\tthe dog sleeps by the fire\nsomething to drink\ta cup of hot tea\n")
  for split in ("train", "dev"):
    (tmp_path / f"{split}.csv").write_text(
      "text,label\n" + "".join(f"{w} number {i},{w}\n" for i in range(4) for w in ("dog", "tea"))
    )
  env = {name: value for name, value in os.environ.items() if name not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "minilm_jax.train",
      "--config",
      os.path.join(ROOT, "configs", "demo.py"),
      "--workdir",
      workdir,
      "--config.num_steps=2",
      "--config.batch_size=4",
      "--config.log_every=1",
      "--config.data.heldout_blocks=8",
      "--config.eval_batch_size=4",
      f"--config.evaluators.wordnet.data={pairs}",
      "--config.evaluators.supersense.task=custom",
      f"--config.evaluators.supersense.train={tmp_path / 'train.csv'}",
      f"--config.evaluators.supersense.dev={tmp_path / 'dev.csv'}",
    ],
    env=env,
    check=True,
    capture_output=True,
    text=True,
    cwd=str(tmp_path),
  )
  noise = [line for line in proc.stderr.splitlines() if any(marker in line for marker in _PLUGIN_LINES)]
  assert noise == [], noise
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == [0, 1, 2] and all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in rows[1:])
  assert {"eval/heldout/loss", "eval/wordnet/mrr@10", "eval/supersense/accuracy"} <= rows[0].keys() & rows[2].keys()
  table = [line for line in proc.stdout.splitlines() if line]
  assert table[0].startswith("| model | parameters | sentences/s | heldout/loss |")
  assert [row.split(" | ")[0] for row in table[2:5]] == [
    "| teacher",
    "| start (step 0): the teacher's uniform layers, undistilled",
    "| student (step 2)",
  ]
  assert table[5].startswith("from step 0 to step 2: heldout/loss ")
  # The newest step, and the best held-out step when it is another one.
  assert runs.RunCheckpoints(workdir, read_only=True).latest_step() == 2
  record = runs.read_record(workdir)
  teacher = json.load(open(os.path.join(minilm_dir, "config.json")))
  # At most half the teacher's Transformer parameters: same width, half the layers.
  assert record.kind == "distillation" and record.teacher == minilm_dir
  assert record.encoder.num_layers * 2 <= teacher["num_hidden_layers"]
  assert record.encoder.hidden_size == teacher["hidden_size"]
  assert os.path.exists(os.path.join(workdir, "tokenizer", "tokenizer.json"))

  # The distilled student exported to Hugging Face gives our hidden states in transformers.
  import torch
  import transformers

  out = str(tmp_path / "student_hf")
  assert run_in_process("convert", "--to-hf", "--workdir", workdir, "--out", out, capfd=capfd).returncode == 0
  config, params, tokenizer = runs.read_run(workdir)[:3]
  batch = tokenizer(
    ["A distilled student.", "It should load in transformers unchanged."], padding=True, return_tensors="np"
  )
  ours = Encoder(config).apply(
    {"params": params}, *(batch[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
  )
  with torch.no_grad():
    theirs = transformers.AutoModel.from_pretrained(out).eval()(**{k: torch.tensor(v) for k, v in batch.items()})
  rows_ = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(
    np.asarray(ours.last_hidden_state)[rows_], theirs.last_hidden_state.numpy()[rows_], atol=1e-4
  )


def test_a_schedule_in_epochs_becomes_steps_once_the_corpus_is_read(tiny_teacher, tiny_corpus, tmp_path):
  """ETD's schedule: `data.epochs` passes over the corpus, the warm-up a share of them."""
  schedule_in_epochs = {
    "data.epochs": 2,
    "num_steps": 0,
    "optimizer.warmup_proportion": 0.25,
    "optimizer.warmup_steps": 0,
  }
  config = tiny_config(tiny_teacher, tiny_corpus, **schedule_in_epochs)
  run = build_distillation(config, str(tmp_path / "w"))
  steps = 2 * run.stream.batches_per_epoch
  assert run.config.num_steps == steps and steps > 8
  schedule = run.lone.step.schedule
  warmup = int(0.25 * steps)
  assert float(schedule(warmup)) == pytest.approx(1e-3) and float(schedule(warmup // 2)) < 1e-3
  assert float(schedule(steps)) == pytest.approx(0.0)


def test_relation_heads_that_do_not_divide(tiny_teacher, tiny_corpus, tmp_path):
  with pytest.raises(UserError, match="does not divide hidden size"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"loss.num_relation_heads": 5}), str(tmp_path / "w"))


def test_empty_corpus(tiny_teacher, tmp_path):
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  with pytest.raises(UserError, match="fewer than one batch"):
    build_distillation(tiny_config(tiny_teacher, str(empty)), str(tmp_path / "w"))


def test_missing_corpus_file(tiny_teacher, tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    build_distillation(tiny_config(tiny_teacher, str(tmp_path / "nope.txt")), str(tmp_path / "w"))


def test_non_finite_update_never_reaches_a_checkpoint(tiny_teacher, tiny_corpus, tmp_path):
  """Divergence on a save step (`lr=1e6`, a save every step): the step skips the
  non-finite update on the device, the loop stops before saving, and every checkpoint left holds
  finite parameters and optimizer moments."""
  workdir = str(tmp_path / "nan")
  blowup = tiny_config(
    tiny_teacher,
    tiny_corpus,
    num_steps=50,
    **{"optimizer.lr": 1e6, "optimizer.warmup_steps": 0, "checkpoint.every": 1, "log_every": 10},
  )
  with pytest.raises(
    UserError, match=r"non-finite loss or update at step \d+ .* the last checkpoint \(step \d+\) is intact"
  ):
    build_distillation(blowup, workdir).run()
  run = build_distillation(blowup, workdir)
  abstract = run.train_step.abstract_state()
  assert run.checkpoints.manager.all_steps()
  for step in run.checkpoints.manager.all_steps():
    state, _, _ = run.checkpoints.restore(abstract, step)
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state)), step


def test_guarded_update_skips_non_finite_updates_on_the_device():
  import jax.numpy as jnp
  import optax

  from minilm_jax.training.train_state import TrainState, guarded_update

  tx = optax.adam(1e-2)
  params = {"w": jnp.ones(3)}
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  applied, skipped = jax.jit(guarded_update, static_argnums=3)(state, {"w": jnp.ones(3)}, jnp.float32(1.0), tx)
  assert float(skipped) == 0 and not np.allclose(applied.params["w"], 1.0)
  for grads, loss in (({"w": jnp.array([1.0, jnp.nan, 1.0])}, 1.0), ({"w": jnp.ones(3)}, jnp.inf)):
    kept, skipped = jax.jit(guarded_update, static_argnums=3)(applied, grads, jnp.float32(loss), tx)
    assert float(skipped) == 1 and int(kept.step) == 2
    for a, b in zip(
      jax.tree.leaves((kept.params, kept.opt_state)), jax.tree.leaves((applied.params, applied.opt_state))
    ):
      np.testing.assert_array_equal(a, b)


def test_a_distillation_hands_its_config_to_the_few_places_it_needs(tiny_teacher, tiny_corpus, tmp_path):
  """`build_distillation`'s config (or a block of it) reaches at most 26 functions in 12 modules
  (`tests/config_walk.py`, the dynamic walk; one of them `reuse.config_key`, the step's key), and a
  family's a few more."""
  from config_walk import summary, walk_call

  stops = walk_call(build_distillation, tiny_config(tiny_teacher, tiny_corpus), str(tmp_path / "run"))
  functions, modules = summary(stops)
  assert functions <= 26 and modules <= 12, list(stops)
  assert ("distill/trainer.py", "build_distillation") in stops
  family = tiny_config(tiny_teacher, tiny_corpus)
  with family.unlocked():
    family.family = (dict(name="a"), dict(name="b", student=dict(num_layers=1)))
  functions, modules = summary(walk_call(build_distillation, family, str(tmp_path / "family")))
  assert functions <= 29 and modules <= 12


@pytest.mark.slow
def test_distillations_of_one_shape_share_one_compiled_step_and_end_as_alone(
  tiny_teacher, tiny_corpus, tmp_path, monkeypatch
):
  """A second distillation in the process whose students differ only in what the step takes as
  arguments (the seed, the learning rate, the warm-up, the length, the corpus) finds the first's
  jitted step, initialiser and held-out loss step and traces the step no more; it ends bitwise as the
  same run does with a step built for it."""
  from minilm_jax.training import reuse

  mesh = parallel.make_mesh(2)
  first = build_distillation(tiny_config(tiny_teacher, tiny_corpus, num_steps=2), str(tmp_path / "first"), mesh)
  first.run()
  overrides = {"seed": 1, "optimizer.lr": 3e-4, "optimizer.warmup_steps": 2, "num_steps": 3}
  second = build_distillation(tiny_config(tiny_teacher, tiny_corpus, **overrides), str(tmp_path / "second"), mesh)
  assert second.train_step.jitted is first.train_step.jitted and second.train_step.init is first.train_step.init
  assert second.train_step.heldout == first.train_step.heldout  # the held-out loss steps: the seed an argument
  state = second.run()
  assert second.train_step.jitted._cache_size() == 1  # one trace, for both runs
  monkeypatch.setattr(reuse, "_built", type(reuse._built)())  # nothing kept: built anew
  alone = build_distillation(tiny_config(tiny_teacher, tiny_corpus, **overrides), str(tmp_path / "alone"), mesh)
  assert alone.train_step.jitted is not first.train_step.jitted
  alone_state = alone.run()
  assert [m["loss"] for m in read_metrics(str(tmp_path / "second"))] == [
    m["loss"] for m in read_metrics(str(tmp_path / "alone"))
  ]
  ours, theirs = (traverse_util.flatten_dict(jax.device_get(s.params), sep="/") for s in (state, alone_state))
  for key, value in theirs.items():
    np.testing.assert_array_equal(ours[key], value, err_msg=key)
