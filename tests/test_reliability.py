"""Bad input and faults (issue 14's table): each ends in one line and exit 2, or works; nothing
saved is lost."""

import copy
import gc
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

import datasets
import pytest
from flax import traverse_util
from hypothesis import event, given
from hypothesis import strategies as st

import minilm_jax
from conftest import (
  DAMAGE,
  ROOT,
  TEST_VOCAB_SIZE,
  apply_overrides,
  damage_settings,
  damaged_bytes,
  load_config_module,
  output_lines,
  read_metrics,
  run_in_process,
  tiny_config,
  train_command,
  xla_flags,
)
from minilm_jax.cli.outputs import MARKER, check_new_directory
from minilm_jax.devices import parallel
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.training.metrics import MetricWriter


def _program(*args, program="train", capfd):
  return run_in_process(program, *args, capfd=capfd)


def _one_line_error(proc, *expected):
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  for text in expected:
    assert text in lines[0], lines[0]
  return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("program", ["train", "bench"])  # every program starts through program.run_program
def test_help_prints_the_flags_and_exits_0(program):
  proc = subprocess.run([sys.executable, "-m", f"minilm_jax.{program}", "--help"], capture_output=True, text=True)
  assert proc.returncode == 0 and "--" in proc.stdout, proc.stderr[-2000:]


def test_a_program_collects_garbage_only_after_its_imports():
  """`python -m minilm_jax.<program>` imports the package with sys.argv[0] == "-m" (as Python's -m
  does while it locates the module): the garbage collector stays off through the imports, then
  `end_of_imports` (in `run_program`, before the program's main) freezes what they made and turns it
  on. Imported as a library (here, the test's own process), the package leaves the collector alone."""
  started = (
    "import sys; sys.argv[:1] = ['-m']; import gc, minilm_jax, minilm_jax.train; assert not gc.isenabled(); "
    "minilm_jax.end_of_imports(); assert gc.isenabled() and gc.get_freeze_count() > 100_000, gc.get_freeze_count()"
  )
  proc = subprocess.run([sys.executable, "-c", started], capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  frozen = gc.get_freeze_count()
  minilm_jax.end_of_imports()
  assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_config_files_that_cannot_be_loaded(tmp_path, capfd):
  _one_line_error(
    _program("--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path / "w"), capfd=capfd), "does not exist"
  )
  bad = tmp_path / "bad.py"
  bad.write_text("def get_config(:\n")
  _one_line_error(
    _program("--config", str(bad), "--workdir", str(tmp_path / "w"), capfd=capfd), "SyntaxError", "line 1"
  )


def test_unknown_config_field_is_named_plainly(tmp_path, capfd):
  line = _one_line_error(
    _program(
      "--config", "configs/demo.py", "--workdir", str(tmp_path / "w"), "--config.student.num_layerz=3", capfd=capfd
    )
  )
  assert "'num_layerz'" in line and '"num_layers"' in line and "\\" not in line


def test_out_of_range_fields_are_refused_before_anything_is_written(tiny_teacher, tiny_corpus, tmp_path, capfd):
  workdir = tmp_path / "w"
  _one_line_error(
    _program("--config", "configs/demo.py", "--workdir", str(workdir), "--config.log_every=0", capfd=capfd),
    "log_every=0 is out of range: it must be at least 1",
  )
  for field, value in (
    ("checkpoint.every", 0),
    ("checkpoint.keep", 0),
    ("num_steps", -5),
    ("batch_size", 0),
    ("optimizer.accumulate_steps", 0),
    ("num_steps", 2**31),
  ):
    with pytest.raises(UserError, match=f"{field}={value} is out of range"):
      build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{field: value}), str(workdir))
  assert not workdir.exists()
  # The seed every program's key and generators take (a 20-digit one overflowed them), and a
  # temperature the logits are divided by (0 is outside its range, which is open there).
  _one_line_error(
    _program("--config", "configs/demo.py", "--workdir", str(workdir), f"--config.seed={10**19}", capfd=capfd),
    f"seed={10**19} is out of range: it must be below {2**31}",
  )
  _one_line_error(
    _program(
      "--config",
      "configs/finetune/task_kd.py",
      "--workdir",
      str(workdir),
      "--config.distill.temperature=0",
      program="finetune",
      capfd=capfd,
    ),
    "distill.temperature=0.0 is out of range: it must be above 0",
  )
  # A dropout rate in range that the 8-bit mask rounds to keeping nothing (a ZeroDivisionError once).
  _one_line_error(
    _program("--config", "configs/demo.py", "--workdir", str(workdir), "--config.student.dropout=0.999", capfd=capfd),
    "student.dropout=0.999 rounds to 256/256 in the 8-bit dropout mask, which keeps nothing: use at most 0.998",
  )
  assert not workdir.exists()
  with pytest.raises(UserError, match=r"data.epochs=1000000000000 passes of \d+ batches make \d+ steps, more than"):
    overrides = {"data.epochs": 10**12, "num_steps": 0, "optimizer.warmup_steps": 0}
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **overrides), str(workdir))


def _every_training_config():
  """(program, the config of every file of configs/ a training program takes), by their modules'
  own loader."""
  from conftest import load_config_module

  for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)):
    config = load_config_module(path).get_config()
    if "optimizer" in config:
      yield os.path.relpath(path, ROOT), config


def test_fields_that_contradict_are_refused_naming_both(tiny_teacher, tiny_corpus, tmp_path, capfd):
  """Every documented pair (`loop.TRAINING_CONTRADICTIONS`, `distill.config.CONTRADICTIONS`): no
  config file sets both; each config that has both fields is refused when both are set, one line
  naming both, before anything is written."""
  from minilm_jax.distill import config as distill_config
  from minilm_jax.training.loop import TRAINING_CONTRADICTIONS, check_fields

  pairs = (*TRAINING_CONTRADICTIONS, *distill_config.CONTRADICTIONS)
  checked = 0
  for name, config in _every_training_config():
    try:
      check_fields(config, {}, distill_config.CONTRADICTIONS)
    except UserError as e:
      pytest.fail(f"{name} as shipped: {e}")
    flat = traverse_util.flatten_dict(config.to_dict(), sep=".")
    for field, unset, other, other_unset, _ in pairs:
      if field in flat and other in flat:
        both = copy.deepcopy(config)
        apply_overrides(both, {field: type(unset)(2), other: type(other_unset)(3)})
        with pytest.raises(UserError, match=rf"{re.escape(field)}=\S+ and {re.escape(other)}=\S+ contradict"):
          check_fields(both, {}, distill_config.CONTRADICTIONS)
        checked += 1
  assert checked >= 2 * 8  # both pairs in every distillation config
  workdir = tmp_path / "w"
  line = _one_line_error(
    _program(
      "--config",
      "configs/demo.py",
      "--workdir",
      str(workdir),
      "--config.data.epochs=1",
      "--config.num_steps=7",
      capfd=capfd,
    ),
    "data.epochs=1 and num_steps=7 contradict",
  )
  assert "set data.epochs=0 or num_steps=0" in line
  with pytest.raises(UserError, match="optimizer.warmup_proportion=0.5 and optimizer.warmup_steps=3 contradict"):
    overrides = {"optimizer.warmup_proportion": 0.5, "optimizer.warmup_steps": 3}
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **overrides), str(workdir))
  assert not workdir.exists()


def test_checkpoints_follow_the_schedule_and_the_last_step(tiny_teacher, tiny_corpus, tmp_path):
  """Saved: every `checkpoint.every` steps and the last; not step 1 (Orbax's own first-save rule)."""
  run = build_distillation(
    tiny_config(tiny_teacher, tiny_corpus, num_steps=5, **{"checkpoint.every": 2, "checkpoint.keep": 5}),
    str(tmp_path / "w"),
  )
  run.run()
  assert list(run.checkpoints.manager.all_steps()) == [2, 4, 5]


def test_a_resumed_run_drops_what_was_logged_after_its_checkpoint(tmp_path):
  writer = MetricWriter(str(tmp_path))
  for step in range(1, 6):
    writer.write(step, {"loss": float(step)})
  writer.close()
  writer = MetricWriter(str(tmp_path), start_step=3)  # resumed from the checkpoint of step 3
  writer.write(4, {"loss": 40.0})
  writer.close()
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3, 4]
  # Killed before its first checkpoint (during the step-0 save, say): the rerun starts afresh, and
  # the metrics hold each step once.
  fresh = tmp_path / "fresh"
  writer = MetricWriter(str(fresh))
  writer.write(0, {"eval/probe/accuracy": 0.5})
  writer.close()
  writer = MetricWriter(str(fresh), start_step=-1)
  writer.write(0, {"eval/probe/accuracy": 0.5})
  writer.close()
  assert [r["step"] for r in read_metrics(str(fresh))] == [0]


def test_zero_accumulation_or_one_that_does_not_split_the_batch(tiny_teacher, tiny_corpus, tmp_path):
  with pytest.raises(UserError, match="accumulate_steps=3 does not split the 8 examples"):
    build_distillation(
      tiny_config(tiny_teacher, tiny_corpus, **{"optimizer.accumulate_steps": 3}),
      str(tmp_path / "w"),
      mesh=parallel.make_mesh(1),
    )


def test_export_refuses_a_non_finite_checkpoint(tiny_teacher, tmp_path):
  """A checkpoint that holds NaN (written by an older version, or by hand) is not exported as a model."""
  import jax
  import numpy as np

  from minilm_jax import runs

  workdir = str(tmp_path / "run")
  runs.write_run_from_hf(tiny_teacher, workdir)
  record = runs.read_record(workdir)
  params = runs.read_run(workdir).params
  params = jax.tree.map(np.asarray, params)
  params["embeddings"]["word_embeddings"]["embedding"][3, 3] = np.nan
  writer = runs.RunCheckpoints(workdir)
  writer.save(1, {"params": params}, {}, record)
  writer.wait()
  with pytest.raises(UserError, match="non-finite parameters .*embeddings/word_embeddings/embedding.*--step"):
    runs.export_run(workdir, str(tmp_path / "out"))
  runs.export_run(workdir, str(tmp_path / "out"), step=0)


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tiny_teacher, tiny_corpus, tmp_path, capfd):
  """A state file cut short (a crash or a full disk during the save): the rerun warns, resumes from
  the step before, keeps the damaged one aside, and export reads the intact one too."""
  import glob
  import os

  from minilm_jax import runs

  workdir = str(tmp_path / "w")
  config = tiny_config(tiny_teacher, tiny_corpus, num_steps=3, **{"checkpoint.keep": 3, "checkpoint.every": 1})
  build_distillation(config, workdir).run()
  # Its files of arrays cut short (not its metadata): some arrays' reads fail while others go on.
  for f in glob.glob(os.path.join(workdir, "checkpoints", "3", "state", "ocdbt.*", "d", "*")):
    if os.path.getsize(f) > 10_000:
      with open(f, "r+b") as handle:
        handle.truncate(os.path.getsize(f) // 4)
  runs.export_run(workdir, str(tmp_path / "exported"))  # read-only: falls back, moves nothing
  # The fallback's warning and the export's note of the parameters left untrained; nothing of
  # Orbax's or TensorStore's (1,779 lines of an ignored exception and a spec, once).
  said = output_lines(capfd.readouterr().err)
  assert len(said) == 2 and "cannot be read" in said[0] and "exported as initialised" in said[1], said
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "3"))
  # Resumed by the program in a process of its own: the reads a failed restore leaves behind
  # (Orbax's coroutines, each holding the failure and a 60-line TensorStore spec) are reported by
  # Python as unraisable when collected, 3,137 lines for one truncated file of the demo's run, and
  # inside pytest its own hook would catch them instead.
  env = dict(os.environ, TINY_TEACHER=tiny_teacher, TINY_CORPUS=tiny_corpus, PYTHONPATH=os.path.join(ROOT, "tests"))
  proc = subprocess.run(
    train_command(workdir, "--config.num_steps=4", "--config.checkpoint.keep=3", "--config.checkpoint.every=1"),
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  said = output_lines(proc.stderr)
  assert proc.returncode == 0 and len(said) == 1, proc.stderr[-3000:]
  assert "warning: the checkpoint of step 3" in said[0] and "using step 2" in said[0], said
  assert "TensorStore details" not in said[0], said
  assert os.path.isdir(os.path.join(workdir, "damaged_checkpoints", "3"))
  assert list(runs.RunCheckpoints(workdir, read_only=True).manager.all_steps()) == [2, 3, 4]  # keep=3


@pytest.fixture
def small_disk(tmp_path):
  """A 6 MiB tmpfs (needs root; skipped where mounting is not allowed)."""
  path = tmp_path / "small"
  path.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(path)], capture_output=True).returncode:
    pytest.skip("cannot mount a tmpfs here")
  yield str(path)
  subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_stops_the_run_and_keeps_the_earlier_checkpoints(tiny_teacher, tiny_corpus, small_disk):
  import glob
  import os

  from conftest import ROOT as root

  workdir = os.path.join(small_disk, "w")
  env = dict(
    os.environ,
    TINY_TEACHER=tiny_teacher,
    TINY_CORPUS=tiny_corpus,
    JAX_PLATFORMS="cpu",
    PYTHONPATH=os.path.join(root, "tests"),
    XLA_FLAGS=xla_flags(1),
  )
  proc = subprocess.Popen(
    [
      sys.executable,
      "-m",
      "minilm_jax.train",
      "--config",
      os.path.join(root, "tests", "tiny_config.py"),
      "--workdir",
      workdir,
      "--config.num_steps=200",
      "--config.checkpoint.every=2",
      "--config.checkpoint.keep=5",
    ],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  # Once a checkpoint is saved, the disk fills up but for room for the metrics' lines: a later save
  # finds no space (the test vocabulary's checkpoints are too small to fill the disk by themselves).
  checkpoints = os.path.join(workdir, "checkpoints")
  deadline = time.time() + 300
  while not (os.path.isdir(checkpoints) and any(name.isdigit() for name in os.listdir(checkpoints))):
    assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-3000:] if proc.poll() else "timeout"
    time.sleep(0.05)
  _fill(small_disk, leave=64 * 1024)
  _, stderr = proc.communicate(timeout=600)
  lines = output_lines(stderr)  # one line, not Orbax's threads' tracebacks
  assert proc.returncode == 2 and len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith("error: saving a checkpoint in") and "No space left on device" in lines[0]
  assert not glob.glob(os.path.join(workdir, "checkpoints", "*tmp*"))  # the partial save is removed
  from minilm_jax import runs

  steps = list(runs.RunCheckpoints(workdir, read_only=True).manager.all_steps())
  assert steps and max(steps) < 200


def test_a_full_disk_at_start_up_is_one_line(tiny_teacher, small_disk, capfd):
  """The docstring corpus (megabytes of text) is the first thing a run on it writes: a disk that is
  already full ends the run there with one line."""
  import os

  with open(os.path.join(small_disk, "filler"), "wb") as f:
    f.write(b"\0" * (5 * 2**20 + 2**19))  # half a MiB of the 6 left
  line = _one_line_error(
    _program(
      "--config",
      "configs/demo.py",
      "--workdir",
      os.path.join(small_disk, "w"),
      f"--config.teacher.path={tiny_teacher}",
      f"--config.student.vocab_size={TEST_VOCAB_SIZE}",
      "--config.student.hidden_size=16",
      "--config.student.num_heads=4",
      "--config.student.num_layers=2",  # a student ETD can take from the tiny teacher: its shape is
      "--config.student.intermediate_size=32",  # checked before the corpus is written
      "--config.loss.num_relation_heads=4",
      "--config.data.max_seq_length=32",
      "--config.data.corpus=demo",
      capfd=capfd,
    ),
    "No space left on device",
    "free space there",
  )
  assert "demo_corpus.txt" in line and not os.listdir(os.path.join(small_disk, "w", "data"))  # no partial file


def test_damaged_weights_tokenizer_and_corpus_files_are_one_line_errors(tiny_teacher, tmp_path):
  import os
  import shutil

  from minilm_jax.data.corpus import load_blocks
  from minilm_jax.distill.config import base_config
  from minilm_jax.models import hf

  damaged = str(tmp_path / "teacher")
  shutil.copytree(tiny_teacher, damaged)
  weights = os.path.join(damaged, "model.safetensors")
  with open(weights, "r+b") as f:
    f.truncate(os.path.getsize(weights) // 2)
  with pytest.raises(UserError, match="could not read the weights file .*model.safetensors .* damaged or incomplete"):
    hf.load(damaged)
  with open(os.path.join(damaged, "tokenizer.json"), "w") as f:
    f.write('{"version": "1.0", "model": ')
  with pytest.raises(UserError, match="could not load the tokenizer in .* damaged or incomplete"):
    hf.load_tokenizer(damaged)

  tokenizer = hf.load_tokenizer(tiny_teacher)
  cases = {
    "bad.jsonl": (b'{"text": "a"}\n{"text": "b"\n', "JSON parse error"),
    "binary.txt": (bytes(range(128, 256)) * 4, "not UTF-8 text"),
    # pyarrow's JSON reader takes a value's bytes unchecked: caught when read, not when tokenised.
    "bad_value.jsonl": (b'{"text": "a"}\n{"text": "b \xff"}\n', "column 'text' is not UTF-8 text at row 2"),
    "empty.txt": (b"", "holds no rows"),
  }
  for name, (content, message) in cases.items():
    path = tmp_path / name
    path.write_bytes(content)
    data = base_config().data
    data.corpus = str(path)
    with pytest.raises(UserError, match=f"could not read corpus .*{name}: .*{message}"):
      load_blocks(data, tokenizer, str(tmp_path / "cache"))


@pytest.mark.parametrize("setting", ["NUM_PROCESSES=0", "NUM_PROCESSES=-1", "NUM_PROCESSES=abc", "CPU_DEVICES=x"])
def test_launcher_settings_that_are_not_counts(setting):
  proc = subprocess.run(["bash", "launch/local.sh", setting, "--help"], capture_output=True, text=True, cwd=ROOT)
  assert proc.returncode == 2 and proc.stderr.strip() == f"error: {setting}: it must be a whole number of at least 1"


def test_launcher_program_that_does_not_exist():
  proc = subprocess.run(
    ["bash", "launch/local.sh", "PROGRAM=trian", "--help"], capture_output=True, text=True, cwd=ROOT
  )
  line = proc.stderr.strip()
  assert proc.returncode == 2 and "\n" not in line, proc.stderr
  assert line.startswith("error: PROGRAM=trian is not a minilm_jax program: use one of aot ") and " train" in line


def test_attention_maps_of_a_sentence_longer_than_the_positions(tiny_teacher, tmp_path, capfd):
  proc = _program(
    "--teacher",
    tiny_teacher,
    "--student",
    tiny_teacher,
    "--sentence",
    " ".join(["word"] * 700),  # past the tokenizer's own 512 too: transformers' warning is not printed
    "--out",
    str(tmp_path / "maps.png"),
    program="attention_maps",
    capfd=capfd,
  )
  _one_line_error(proc, "702 tokens long", "64 positions")
  assert not (tmp_path / "maps.png").exists()


def _export(workdir, out, *flags, capfd):
  return _program("--to-hf", "--workdir", workdir, "--out", out, *flags, program="convert", capfd=capfd)


def _leftovers(parent):
  """What an interrupted or failed write could leave beside its destination."""
  import os

  return [name for name in os.listdir(parent) if ".partial-" in name or name.endswith(".replaced")]


@pytest.mark.slow
def test_an_export_is_never_written_over_without_overwrite_nor_left_half(tiny_teacher, tmp_path, capfd):
  from minilm_jax import runs

  run, out = str(tmp_path / "run"), str(tmp_path / "export")
  runs.write_run_from_hf(tiny_teacher, run)
  assert _export(run, out, capfd=capfd).returncode == 0
  weights = os.path.join(out, "model.safetensors")
  digest = lambda: hashlib.sha256(open(weights, "rb").read()).hexdigest()
  before, stamp = digest(), os.path.getmtime(weights)
  # Again over it: refused before any work, nothing touched.
  _one_line_error(_export(run, out, capfd=capfd), f"--out {out} already holds", "model.safetensors", "--overwrite")
  assert os.path.getmtime(weights) == stamp
  # --overwrite with an export that fails midway (no such step): the earlier export is intact.
  _one_line_error(_export(run, out, "--overwrite", "--step", "7", capfd=capfd), "step")
  assert digest() == before and os.path.getmtime(weights) == stamp and not _leftovers(str(tmp_path))
  # --overwrite that succeeds replaces it whole.
  assert _export(run, out, "--overwrite", capfd=capfd).returncode == 0
  assert os.path.getmtime(weights) != stamp and digest() == before and not _leftovers(str(tmp_path))
  assert os.stat(out).st_mode & 0o755 == 0o755  # what a mkdir gives, not the staging directory's private mode
  # A writer killed (kill -9) left its hidden staging directory: the next write of that output
  # removes it; a running writer's is left alone.
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  killed, running = tmp_path / f".export.partial-{int(dead.stdout)}-x1", tmp_path / f".export.partial-{os.getpid()}-x2"
  for left in (killed, running):
    left.mkdir()
    (left / "model.safetensors").write_bytes(b"half")
  assert _export(run, out, "--overwrite", capfd=capfd).returncode == 0
  assert not killed.exists() and running.exists()
  shutil.rmtree(running)
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(UserError, match="is a file: name a directory"):
    check_new_directory(str(tmp_path / "a_file"), "--out", overwrite=True)


def test_a_full_disk_during_an_export_is_one_line_and_leaves_nothing(tiny_teacher, tmp_path, small_disk, capfd):
  import os

  from minilm_jax import runs

  run = str(tmp_path / "run")
  runs.write_run_from_hf(tiny_teacher, run)
  _fill(small_disk)  # the tiny teacher's export needs more than the nothing left
  out = os.path.join(small_disk, "export")
  line = _one_line_error(_export(run, out, capfd=capfd), "No space left on device", "nothing was written to --out")
  assert "checkpoint" not in line and sorted(os.listdir(small_disk)) == ["filler"]


def _fill(disk: str, leave: int = 0):
  """Fills `disk` to its last byte (any write there fails), or to `leave` bytes of it."""
  path = os.path.join(disk, "filler")
  try:  # a disk the program filled already refuses even the filler's creation (once seen in CI)
    with open(path, "wb") as f:
      while True:
        f.write(b"\0" * 65536)
        f.flush()
  except OSError:
    pass
  if leave and os.path.exists(path):
    os.truncate(path, max(0, os.path.getsize(path) - leave))


@pytest.mark.parametrize("writer", ["prepare_data", "evaluate", "bench"])
def test_a_full_disk_at_every_writer_is_one_line_and_leaves_nothing(
  writer, tiny_teacher, tiny_corpus, small_disk, monkeypatch, capfd
):
  """A prepared corpus (numpy's writes cut short, without an errno), an evaluation's results, a
  benchmark's report, written onto a full disk: the one line a full disk is for checkpoints, and
  nothing half-written left beside the filler."""
  from conftest import WORDNET_SMALL

  out = os.path.join(small_disk, "out")
  _fill(small_disk)
  monkeypatch.setenv("TINY_TEACHER", tiny_teacher)  # tests/tiny_config.py's teacher and corpus
  monkeypatch.setenv("TINY_CORPUS", tiny_corpus)
  args = {
    "prepare_data": ["--config", os.path.join(ROOT, "tests", "tiny_config.py"), "--out", out],
    "evaluate": [
      "--embeddings",
      tiny_teacher,
      "--wordnet_dir",
      WORDNET_SMALL,
      "--max_seq_length",
      "32",
      "--out",
      out,
    ],
    "bench": ["kernels", "--seq_len=32", "--batch=2", "--repeats=1", f"--json={out}.json"],
  }[writer]
  proc = run_in_process(writer, *args, capfd=capfd)
  lines = output_lines(proc.stderr)  # progress bars left out
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert "free space there" in lines[0] and ("No space left on device" in lines[0] or "cut short" in lines[0])
  assert os.listdir(small_disk) == ["filler"]


def test_a_write_numpy_cuts_short_is_the_one_line_of_a_full_disk(capfd, monkeypatch):
  """numpy reports a write the disk cut short without an errno ("6400 requested and 2016 written"):
  a program says what it means in the one line of a full disk, not a traceback."""
  from minilm_jax.cli.program import Program, run_program

  def main(argv):
    raise OSError("6400 requested and 2016 written")

  monkeypatch.setattr(sys, "argv", ["program"])
  with pytest.raises(SystemExit) as exit_:
    run_program(main, Program())
  proc = subprocess.CompletedProcess(sys.argv, exit_.value.code, "", capfd.readouterr().err)
  _one_line_error(proc, "a write was cut short (2016 of 6400 bytes written: is the disk full?)", "free space there")


def test_task_files_that_are_not_text_or_not_utf8_are_one_line_errors(tmp_path):
  """SQuAD JSON in another encoding, seq2seq line and JSON Lines files that are not text: one line naming the file."""
  from minilm_jax.tasks import get_task

  latin1 = '{"data": [{"paragraphs": [{"context": "Café", "qas": []}]}]}'.encode("latin-1")
  (tmp_path / "dev-v2.0.json").write_bytes(latin1)
  with pytest.raises(UserError, match=r"dev-v2.0.json is not UTF-8 text \(byte \d+\)"):
    get_task("squad2").load("dev", str(tmp_path))
  (tmp_path / "dev.json").write_bytes(latin1)
  with pytest.raises(UserError, match=r"dev.json is not UTF-8 text"):
    get_task("qg").load("dev", str(tmp_path))
  (tmp_path / "dev.jsonl").unlink(missing_ok=True)
  (tmp_path / "dev.source").write_bytes(bytes(range(256)))
  (tmp_path / "dev.target").write_text("a summary\n")
  with pytest.raises(UserError, match=r"dev.source is not UTF-8 text"):
    get_task("cnndm").load("dev", str(tmp_path))
  (tmp_path / "dev.source").write_bytes(b"text\0with a NUL\n")
  with pytest.raises(UserError, match=r"dev.source holds NUL bytes"):
    get_task("cnndm").load("dev", str(tmp_path))
  for side in ("source", "target"):
    (tmp_path / f"dev.{side}").unlink()
  (tmp_path / "dev.jsonl").write_bytes(b'{"source": "a", "target": "\xff"}\n')
  with pytest.raises(UserError, match=r"dev.jsonl is not UTF-8 text"):
    get_task("cnndm").load("dev", str(tmp_path))


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, capfd):
  (tmp_path / "a_file").write_text("x")
  for program, config in (("train", "configs/demo.py"), ("finetune", "configs/finetune/glue.py")):
    _one_line_error(
      _program("--config", config, "--workdir", str(tmp_path / "a_file"), program=program, capfd=capfd),
      "is a file: name a directory",
    )


@pytest.mark.slow
def test_evaluate_never_writes_over_earlier_results(tiny_teacher, tmp_path, capfd):
  """`evaluate --out` holding earlier results is refused in one line before any work; with
  --overwrite the new results replace them only once complete, and only an earlier output of ours."""
  from conftest import WORDNET_SMALL

  out = tmp_path / "results"
  args = ["--embeddings", tiny_teacher, "--out", str(out), "--wordnet_dir", WORDNET_SMALL, "--max_seq_length", "16"]
  assert _program(*args, program="evaluate", capfd=capfd).returncode == 0
  earlier = (out / "embeddings.json").read_text()
  _one_line_error(_program(*args, program="evaluate", capfd=capfd), f"--out {out} already holds 2 files", "--overwrite")
  assert (out / "embeddings.json").read_text() == earlier
  proc = _program(*args, "--overwrite", program="evaluate", capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert sorted(os.listdir(out)) == [MARKER, "embeddings.json"]
  assert json.load(open(out / "embeddings.json"))["rows"][0]["model"]
  assert [p for p in os.listdir(tmp_path) if p.startswith(".results")] == []  # no staging directory left


def _tree_digest(root) -> str:
  """One checksum of every file under `root`: its path and its bytes."""
  digest = hashlib.sha256()
  for folder, _, files in sorted(os.walk(root)):
    for name in sorted(files):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode() + open(path, "rb").read())
  return digest.hexdigest()


@pytest.mark.slow
def test_no_output_replaces_or_enters_what_its_program_reads_nor_what_we_did_not_write(tiny_teacher, tmp_path, capfd):
  """The five ways `--overwrite` deleted data (an output that is the run it reads, inside it or
  above it, for `convert` and `evaluate`), refused in one line before any work, and `--overwrite`
  over a folder that is not an earlier output of ours; every input byte for byte as it was."""
  from minilm_jax import runs

  parent = tmp_path / "runs"
  run = str(parent / "run")
  runs.write_run_from_hf(tiny_teacher, run)
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("my own notes")
  before = _tree_digest(tmp_path)
  # Through the programs: the run as --out, and a folder holding the run.
  _one_line_error(
    _program("--to-hf", "--workdir", run, "--out", run, "--overwrite", program="convert", capfd=capfd), "is the run"
  )
  _one_line_error(
    _program("--runs", run, "--out", str(parent), "--overwrite", program="evaluate", capfd=capfd),
    f"contains the run {run}",
  )
  _one_line_error(
    _program("--to-hf", "--workdir", run, "--out", str(mine), "--overwrite", program="convert", capfd=capfd),
    "not an earlier output of minilm_jax",
  )
  # The rule itself, for each way an output can meet an input (links resolved).
  os.symlink(run, tmp_path / "link")
  for out, text in [
    (run + "/checkpoints", "lies inside it"),
    (str(tmp_path / "link"), "is the run"),
    (str(tmp_path), "contains the run"),
  ]:
    with pytest.raises(UserError, match=text):
      check_new_directory(out, "--out", True, [("the run", run)])
  check_new_directory(str(tmp_path / "new"), "--out", False, [("the run", run), ("the model", "org/hub-name")])
  _one_line_error(
    _program("--peak_buffers", "-3", program="aot", capfd=capfd), "--peak_buffers=-3", "not a non-negative integer"
  )
  # A program without --overwrite (convert --from-hf) does not offer it.
  with pytest.raises(UserError) as refused:
    check_new_directory(str(mine), "--out", False, overwritable=False)
  assert str(refused.value).endswith("choose a new --out")
  assert _tree_digest(tmp_path) == before


def test_a_damaged_parquet_task_file_is_one_line_not_two(tiny_teacher, tmp_path, capfd):
  """`datasets` logged "Failed to read schema ..." at ERROR before our one line said the same."""
  bad = tmp_path / "train.parquet"
  bad.write_bytes(b"PAR1" + b"\x07" * 40 + b"PAR1")
  _one_line_error(
    _program(
      "--config",
      "configs/finetune/glue.py",
      "--workdir",
      str(tmp_path / "w"),
      "--config.task=custom",
      f"--config.init={tiny_teacher}",
      f"--config.data.train={bad}",
      f"--config.data.dev={bad}",
      program="finetune",
      capfd=capfd,
    ),
    f"data.train='{bad}' could not be read",
  )


def test_asyncio_reports_of_failed_orbax_writes_are_left_out(tmp_path):
  """A failed save reaches the run as one line (`RunCheckpoints.check`); asyncio also logs each
  write whose exception nobody retrieved, a task (named in the message) or a bare future (Orbax
  only in its traceback: the full-disk test once printed one). Other asyncio reports stay."""
  import logging
  import os

  from minilm_jax.runs.checkpoints import quiet_orbax_failure_reports

  quiet_orbax_failure_reports()  # as every program does when it starts
  asyncio_logger = logging.getLogger("asyncio")

  def report(code_path):
    try:  # an exception raised in a file under an orbax/ folder, as Orbax's async_path raises it
      exec(compile("raise OSError(28, 'No space left on device')", code_path, "exec"))
    except OSError as e:
      exc_info = (type(e), e, e.__traceback__)
    return logging.LogRecord(
      "asyncio", logging.ERROR, "base_events.py", 1771, "Future exception was never retrieved", (), exc_info
    )

  orbax_file = os.path.join(os.sep, "site-packages", "orbax", "checkpoint", "async_path.py")
  assert not asyncio_logger.filter(report(orbax_file))
  assert asyncio_logger.filter(report(os.path.join(os.sep, "mine", "job.py")))


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
@damage_settings(max_examples=15)
@given(how=st.sampled_from(DAMAGE), data=st.data())
def test_damaged_tokenizer_files_load_or_are_one_line(tiny_teacher, name, how, data):
  """A Hugging Face directory's tokenizer files damaged as the task files are: the tokenizer loads
  and tokenises, or one line names the directory and the cause."""
  import shutil
  import tempfile

  from minilm_jax.models import hf

  with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "model")
    shutil.copytree(tiny_teacher, copy)
    path = os.path.join(copy, name)
    with open(path, "rb") as f:
      valid = f.read()
    with open(path, "wb") as f:
      f.write(damaged_bytes(valid, how, data))
    try:
      hf.load_tokenizer(copy)("A sentence to tokenise.")
      event(f"{how}: loaded")
    except UserError as e:
      assert "\n" not in str(e) and copy in str(e), str(e)
      event(f"{how}: one line")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_teacher, tiny_corpus):
  """A two-step run keeping both checkpoints, and each step's parameters as saved."""
  from minilm_jax import runs

  workdir = str(tmp_path_factory.mktemp("finished") / "run")
  config = tiny_config(tiny_teacher, tiny_corpus, num_steps=2, **{"checkpoint.keep": 2, "checkpoint.every": 1})
  build_distillation(config, workdir).run()
  steps = {step: runs.read_run(workdir, step=step).params for step in (1, 2)}
  return workdir, steps


@pytest.mark.slow
@damage_settings(max_examples=15)
@given(how=st.sampled_from(DAMAGE), data=st.data())
def test_a_damaged_file_of_the_latest_checkpoint_is_read_around_or_one_line(finished_run, how, data):
  """Any file of the latest checkpoint damaged: reading the run gives step 2's parameters exactly
  (a file reading does not need), or step 1's after one warning line, or one error line; never
  other parameters and never a traceback."""
  import shutil
  import tempfile

  import jax
  import numpy as np

  from minilm_jax import runs

  workdir, steps = finished_run
  latest = os.path.join(workdir, "checkpoints", "2")
  files = sorted(os.path.relpath(os.path.join(d, f), latest) for d, _, fs in os.walk(latest) for f in fs)
  name = data.draw(st.sampled_from(files), label="file")
  with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "run")
    shutil.copytree(workdir, copy)
    path = os.path.join(copy, "checkpoints", "2", name)
    with open(path, "rb") as f:
      valid = f.read()
    with open(path, "wb") as f:
      f.write(damaged_bytes(valid, how, data))
    try:
      params = runs.read_run(copy).params
    except UserError as e:
      assert "\n" not in str(e), str(e)
      event(f"{how}: one line")
      return
    same = {
      step: all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(saved)))
      for step, saved in steps.items()
    }
    assert same[1] or same[2], f"{how} of {name}: parameters of neither step"
    event(f"{how}: step {2 if same[2] else 1}")


def test_a_changed_byte_in_an_array_of_the_latest_checkpoint_is_found_by_its_checksum(finished_run, tmp_path, capfd):
  """The bytes of an array changed in place in the latest checkpoint's data file: Orbax reads them
  back without an error (random floats do not compress, and zstd stores such a chunk as it is),
  so the CRC-32 saved with the step finds the change: the run is read at step 1 after one line."""
  import shutil

  import jax
  import numpy as np

  from minilm_jax import runs

  workdir, steps = finished_run
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  latest = os.path.join(copy, "checkpoints", "2")
  files = {os.path.join(d, f): open(os.path.join(d, f), "rb").read() for d, _, fs in os.walk(latest) for f in fs}
  # An array's first 8 values, all different (not a bias that one Adam step moved by exactly ±lr,
  # whose pattern other arrays share), found once in all the step's files: that array's bytes.
  flat = traverse_util.flatten_dict(steps[2], sep="/")
  needles = {name: np.asarray(leaf).ravel()[:8] for name, leaf in flat.items()}
  needles = {name: n.tobytes() for name, n in needles.items() if len(np.unique(n)) == 8}
  stored = [
    (name, path, contents.index(needle))
    for name, needle in needles.items()
    for path, contents in files.items()
    if needle in contents and sum(c.count(needle) for c in files.values()) == 1
  ]
  assert stored, "no array of step 2 is stored as its bytes"
  # Every array found is changed: in about one run of ten the 16x16 pooler kernel's bytes found are
  # not the ones the read follows (a copy OCDBT left beside them; the read gave step 2 exactly),
  # while the larger layer_1/output/kernel's always were.
  for _, path, offset in stored:
    contents = bytearray(open(path, "rb").read())
    contents[offset + 5] ^= 0x10  # a float's mantissa: the value changes a little, silently
    open(path, "wb").write(bytes(contents))
  capfd.readouterr()
  params = runs.read_run(copy).params
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(steps[1])))
  lines = capfd.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("warning: the checkpoint of step 2") and "CRC-32" in lines[0], lines
  assert any(f"the array params/{name} reads back" in lines[0] for name, _, _ in stored), (lines, stored)


@pytest.mark.parametrize("task, name", [("squad2", "dev-v2.0.json"), ("qg", "dev.json")])
def test_answers_that_do_not_lie_in_their_text_are_one_line(tmp_path, monkeypatch, task, name):
  """A SQuAD-format file whose answer_start is not a number, or points where the context does not
  hold the answer, is refused when read: the first bad question named, and how many there are. The
  hub's copy is checked the same way (here a stand-in in the hub's schema, answer_start as text)."""
  from minilm_jax.tasks import get_task

  context = "Café au lait is coffee with milk."
  qas = [
    {"id": "good", "question": "What is it?", "answers": [{"text": "coffee", "answer_start": 16}]},
    {"id": "shifted", "question": "What?", "answers": [{"text": "coffee", "answer_start": 15}]},
    {"id": "word", "question": "Which?", "answers": [{"text": "milk", "answer_start": "twenty"}]},
  ]
  (tmp_path / name).write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))
  with pytest.raises(UserError, match=r"2 answer\(s\) do not lie at their answer_start .* question shifted") as e:
    get_task(task).load("dev", str(tmp_path))
  assert "\n" not in str(e.value)
  qas[1:] = []
  (tmp_path / name).write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))
  assert len(get_task(task).load("dev", str(tmp_path))) >= 1

  hub_rows = {
    "id": ["good", "word"],
    "title": ["t", "t"],
    "context": [context, context],
    "question": ["What is it?", "Which?"],
    "answers": [{"text": ["coffee"], "answer_start": ["16"]}, {"text": ["milk"], "answer_start": ["twenty"]}],
  }
  monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: datasets.Dataset.from_dict(hub_rows))
  with pytest.raises(UserError, match=r"rajpurkar/squad\S*: 2 answer\(s\) do not lie .* question good .* at '16'"):
    get_task(task).load("dev", "")


def test_a_workdir_on_a_shared_file_system_is_leased_by_its_heartbeat(tmp_path, caplog):
  """Where locks do not reach across hosts (some shared file systems), the lock's record is a lease:
  another host's record refreshed within STALE_AFTER_S is a run there, refused in one line; an older
  one is a run that ended without letting go, taken over with one line. A process that holds the
  workdir already holds it again (a run resumed in the same process)."""
  import time

  from minilm_jax.runs import lock

  workdir = tmp_path / "run"
  workdir.mkdir()
  record = {"host": "elsewhere", "pid": 4242, "program": "finetune", "started": time.time() - 60}
  (workdir / lock.LOCK_FILE).write_text(json.dumps({**record, "heartbeat": time.time() - 5}))
  with pytest.raises(UserError, match=r"--workdir .* is in use by finetune \(pid 4242 on elsewhere, started "):
    lock.hold(str(workdir))
  (workdir / lock.LOCK_FILE).write_text(json.dumps({**record, "heartbeat": time.time() - lock.STALE_AFTER_S - 1}))
  with caplog.at_level("WARNING"):
    lock.hold(str(workdir))
    lock.hold(str(workdir))
  assert "taking over the lock of finetune (pid 4242 on elsewhere" in caplog.text
  held = json.loads((workdir / lock.LOCK_FILE).read_text())
  assert held["pid"] == os.getpid() and held["host"] != "elsewhere"
  lock.release(str(workdir))
  assert os.listdir(workdir) == []  # let go: the record removed, the workdir (made by the user) kept


def test_a_cache_whose_write_fails_short_leaves_no_half_file(tmp_path):
  """Caches (teacher logits, augmented sets), corpora, reports and metrics rewrites are written under
  a pending name and renamed once whole: a write the disk cuts short (numpy's OSError without an
  errno) leaves neither the pending file nor a file at the cache's name, and names the cache."""
  import numpy as np

  from minilm_jax.data.files import written_whole
  from minilm_jax.errors import storage_failure

  path = str(tmp_path / "sst2-teacher-0123.npy")
  with pytest.raises(OSError) as failed, written_whole(path) as pending:
    np.save(pending, np.zeros(4))
    raise OSError("6400 requested and 2016 written")
  assert os.listdir(tmp_path) == [] and failed.value.filename == path
  assert storage_failure(failed.value) == "a write was cut short (2016 of 6400 bytes written: is the disk full?)"
  with written_whole(path) as pending:
    np.save(pending, np.ones(4))
  assert os.listdir(tmp_path) == ["sst2-teacher-0123.npy"] and np.load(path).tolist() == [1.0] * 4


def test_names_longer_than_the_file_system_takes_are_one_line(tiny_teacher, tmp_path, capfd):
  """A --workdir (the run's lock is its first write) or a convert --out (written under a longer
  hidden name first) whose name passes the file system's 255 bytes: one line naming the path."""
  long_name = str(tmp_path / ("w" * 300))
  _one_line_error(
    _program("--config", "configs/demo.py", "--workdir", long_name, capfd=capfd), long_name, "longer than the file"
  )
  out = str(tmp_path / ("o" * 240))
  line = _one_line_error(
    _program("--from-hf", tiny_teacher, "--out", out, program="convert", capfd=capfd), f"--out {out}:"
  )
  assert "partial" not in line and os.listdir(tmp_path) == []


def test_a_run_lock_that_is_a_directory_or_holds_no_record(tmp_path, caplog, capfd):
  """A `run.lock` that is a directory is one line (not IsADirectoryError), and nothing else in the
  workdir is touched; one holding garbage (no record a run wrote) is taken over with the notice a
  dead run's lock gets, not silently."""
  from minilm_jax.runs import lock

  workdir = tmp_path / "run"
  (workdir / lock.LOCK_FILE).mkdir(parents=True)
  _one_line_error(
    _program("--config", "configs/demo.py", "--workdir", str(workdir), capfd=capfd),
    f"--workdir {workdir}: its run.lock is a directory",
  )
  assert os.listdir(workdir) == [lock.LOCK_FILE]
  other = tmp_path / "other"
  other.mkdir()
  (other / lock.LOCK_FILE).write_bytes(b"\x00garbage{")
  with caplog.at_level("WARNING"):
    lock.hold(str(other))
  assert f"taking over {other / lock.LOCK_FILE}, which holds no record a run wrote" in caplog.text
  lock.release(str(other))


@pytest.mark.slow
def test_two_conversions_into_one_out_leave_one_run_and_say_so(tiny_teacher, tmp_path):
  """Two `convert --from-hf` started together into one --out: one writes the run and says so, the
  other says in one line that it wrote nothing (found --out taken at its start, or written by the
  first while it converted): never both "wrote", one replacing the other."""
  from minilm_jax import runs

  out = str(tmp_path / "converted")
  command = [sys.executable, "-m", "minilm_jax.convert", "--from-hf", tiny_teacher, "--out", out]
  procs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in "ab"]
  results = sorted((p.wait(), p.communicate()[1]) for p in procs)
  (ok, wrote), (refused, error) = results
  assert ok == 0 and f"wrote run {out} from {tiny_teacher}" in wrote, wrote[-2000:]
  assert refused == 2 and error.strip().splitlines()[-1].startswith(f"error: --out {out} "), error[-2000:]
  assert runs.is_run(out) and sorted(os.listdir(tmp_path)) == ["converted"]


def test_a_profile_into_a_read_only_folder_is_refused_before_the_measurement(tmp_path, capfd):
  """`bench distill --profile` writes its trace after minutes of measuring: a folder that takes no
  file (a read-only mount) is one line before any of it, not JAX's error after."""
  read_only = tmp_path / "ro"
  read_only.mkdir()
  if subprocess.run(
    ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)], capture_output=True
  ).returncode:
    pytest.skip("cannot mount a tmpfs here")
  try:
    started = time.perf_counter()
    proc = _program("distill", "--case", "cpu", "--profile", str(read_only / "profiles"), program="bench", capfd=capfd)
    _one_line_error(proc, f"--profile {read_only / 'profiles'}: {read_only} takes no new file (Read-only file system)")
    assert "ours" not in proc.stdout and time.perf_counter() - started < 60
  finally:
    subprocess.run(["umount", "--lazy", str(read_only)], capture_output=True)


@pytest.mark.slow
def test_a_fine_tuning_rerun_after_a_kill_says_the_takeover_alone(tiny_teacher, tmp_path, capfd):
  """kill -9 can stop a save after its step folder is in place but before Orbax's metadata: the rerun
  (of `finetune`, as users run it) takes the dead run's lock over with its one line, and Orbax's
  "Metadata file does not exist" warnings about that step are not printed around it."""
  from minilm_jax.finetuning.run import build_finetuning
  from minilm_jax.runs import lock

  workdir = tmp_path / "run"
  settings = {
    "task": "wordnet_supersense",
    "data_dir": os.path.join(ROOT, "minilm_jax", "data", "wordnet"),
    "init": tiny_teacher,
    "max_seq_length": 32,
    "epochs": 1,
    "mesh.data": 1,
  }
  config = apply_overrides(load_config_module(os.path.join(ROOT, "configs/finetune/glue.py")).get_config(), settings)
  build_finetuning(config, str(workdir)).run()  # the run that was killed, here to its end
  lock.release(str(workdir))
  command = ["--config", "configs/finetune/glue.py", "--workdir", str(workdir)]
  command += [f"--config.{field}={value}" for field, value in settings.items()]
  checkpoints = workdir / "checkpoints"
  last = max(int(name) for name in os.listdir(checkpoints) if name.isdigit())
  shutil.copytree(checkpoints / str(last), checkpoints / str(last + 1000))
  for name in ("_CHECKPOINT_METADATA", "commit_success.txt"):
    (checkpoints / str(last + 1000) / name).unlink(missing_ok=True)
  killed = {"host": os.uname().nodename, "pid": 2**22 + 1, "program": "finetune", "started": time.time() - 60}
  (workdir / "run.lock").write_text(json.dumps({**killed, "heartbeat": time.time() - 30}))
  rerun = _program(*command, program="finetune", capfd=capfd)
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert "taking over the lock of finetune (pid 4194305" in rerun.stderr
  assert "Metadata file does not exist" not in rerun.stderr, rerun.stderr[-2000:]
