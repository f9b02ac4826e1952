"""Benchmark correctness (never timings): the PyTorch reference computes our loss, the teacher's
unused layers cost nothing, and the program writes the rows it prints."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import ROOT, VADER_EXCERPT, WORDNET_SMALL, WORDNET_SMALL_TRAIN, run_in_process
from minilm_jax import runs
from minilm_jax.benchmarks import distill, generation, inference, memory, student_speed, torch_peer
from minilm_jax.devices import parallel, timing
from minilm_jax.distill.step import LONE, DistillationStep, jit_step
from minilm_jax.errors import UserError
from minilm_jax.models import flops
from minilm_jax.models.attention import merge_heads
from minilm_jax.models.encoder import Encoder, EncoderConfig, LayerOutput
from minilm_jax.training.train_state import Schedule, adamw
from minilm_jax.transfer import relations
from minilm_jax.transfer.objectives import Masking, Objective


def test_reference_loss_is_ours():
  rng = np.random.default_rng(0)
  t = {n: rng.standard_normal((2, 12, 7, 8)).astype(np.float32) for n in "qkv"}
  s = {n: rng.standard_normal((2, 12, 7, 4)).astype(np.float32) for n in "qkv"}
  mask = np.array([[1] * 7, [1] * 4 + [0] * 3])
  ours = relations.minilm_loss(
    LayerOutput(**{n: jnp.asarray(x) for n, x in t.items()}, attention=None, hidden=None),
    LayerOutput(**{n: jnp.asarray(x) for n, x in s.items()}, attention=None, hidden=None),
    jnp.asarray(mask),
    ("qk", "vv"),
    12,
  )
  merged = lambda d, n: torch.tensor(np.asarray(merge_heads(jnp.asarray(d[n]))))  # what the hooks capture
  m = torch.tensor(mask).bool()
  qk = torch_peer.relation_kl((merged(t, "q"), merged(t, "k")), (merged(s, "q"), merged(s, "k")), m, 12)
  vv = torch_peer.relation_kl((merged(t, "v"), merged(t, "v")), (merged(s, "v"), merged(s, "v")), m, 12)
  np.testing.assert_allclose(qk.item(), float(ours["qk"]), rtol=1e-5)
  np.testing.assert_allclose(vv.item(), float(ours["vv"]), rtol=1e-5)


def _step_flops(teacher_config, teacher_layer):
  mesh = parallel.make_mesh(1)
  student = Encoder(EncoderConfig(vocab_size=100, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32))
  schedule = Schedule.of(distill.OPTIMIZER, 10)
  objective = Objective("minilm", ((1, teacher_layer),), ("qk", "vv"), 4, 0, teacher_config.hidden_size, 16)
  parts = DistillationStep(Encoder(teacher_config), student, objective, partial(adamw, distill.OPTIMIZER), schedule)
  step = jit_step({LONE: parts}, mesh)
  state = parts.abstract_state()
  teacher_params = jax.eval_shape(
    lambda: Encoder(teacher_config).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  )
  batch = {k: jax.ShapeDtypeStruct((4, 16), jnp.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
  # As lowered, before XLA optimises: layers the step never builds, not layers XLA removes.
  return step.lower(state, batch, teacher_params, jax.random.key(0), {LONE: schedule}).cost_analysis()["flops"]


def test_teacher_layers_above_the_distilled_one_cost_nothing():
  deep = EncoderConfig(vocab_size=100, hidden_size=32, num_layers=6, num_heads=4, intermediate_size=64)
  reading_layer_1 = _step_flops(deep, teacher_layer=1)
  assert reading_layer_1 == _step_flops(deep.replace(num_layers=2), teacher_layer=1)
  assert _step_flops(deep, teacher_layer=5) > 1.5 * reading_layer_1


@pytest.mark.slow
def test_bench_memory_writes_the_rows_it_prints(tmp_path, capfd):
  rows = memory.run(batch_size=2, query_chunk=16, seq_lens=(64,))
  assert set(rows[0]) >= {"seq_len", "full_bytes", "chunked_bytes"} and rows[0]["chunked_bytes"] < rows[0]["full_bytes"]
  out = tmp_path / "mem.json"
  proc = run_in_process("bench", "memory", "--json", out, capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-2000:]
  written = json.loads(out.read_text())
  assert [r["seq_len"] for r in written] == [128, 256, 512]
  assert "chunked_bytes" in proc.stdout.splitlines()[0]
  # The issue's bound: at length 512 the chunked loss needs at most a quarter of the full loss's memory.
  assert written[-1]["chunked_bytes"] <= written[-1]["full_bytes"] / 4
  # Again into the same file: refused before any work, the results kept.
  again = run_in_process(*proc.args, capfd=capfd)
  assert again.returncode == 2 and again.stderr.strip() == (
    f"error: --json {out} already exists: name a new file (earlier results are never replaced)"
  )
  assert json.loads(out.read_text()) == written
  # Into a folder that does not exist: refused before any work too (aot's --json, the same check, after
  # a whole compile it once threw away).
  missing = tmp_path / "no_such_folder" / "mem.json"
  lost = run_in_process(*proc.args[:-1], missing, capfd=capfd)
  assert lost.returncode == 2 and lost.stderr.strip() == (
    f"error: --json {missing}: its folder {missing.parent} does not exist: name a file in an existing folder"
  )


def test_analytic_flops_are_the_issues_formula():
  """Per token, a full layer of width d at length S costs 24 d^2 + 4 S d; the teacher's layers below
  the read one in full, plus that layer's Q/K/V (6 d^2) and two relations' logits (2 x 2 S d); the
  student the same, three times."""
  teacher, student, s = (
    EncoderConfig(hidden_size=768, num_layers=12, intermediate_size=3072),
    EncoderConfig(hidden_size=384, num_layers=6, intermediate_size=1536),
    512,
  )
  share = lambda layers, d: layers * (24 * d * d + 4 * s * d) + 6 * d * d + 2 * 2 * s * d
  assert flops.distill_flops_per_token(flops.LossLayer(teacher, 11), flops.LossLayer(student, 5), s) == share(
    11, 768
  ) + 3 * share(5, 384)
  assert flops.encoder_flops_per_token(teacher, s) == 12 * (24 * 768**2 + 4 * s * 768)


@pytest.mark.slow
def test_bench_distill_paper_case_at_tiny_sizes():
  """The `paper` case's code path (ours bare and through the train program, both PyTorch peers)
  with a tiny teacher and student, on CPU: every column filled, MFU only where a peak is known."""
  rows = distill.run(
    distill.Settings(
      case="paper", repeats=1, teacher="2x64x4", students=["1x32x4"], batch_size=4, seq_lens=[8], train_steps=2
    )
  )
  assert [(r["student"], r["seq_len"], r["batch"]) for r in rows] == [("1x32x4", 8, 4)]
  for row in rows:
    for key in (
      "ours_tokens_per_s",
      "train_program_tokens_per_s",
      "torch_eager_tokens_per_s",
      "torch_compile_tokens_per_s",
      "ratio_vs_eager",
      "ratio_vs_compile",
      "ours_mem_gib",
    ):
      assert row[key] > 0, key
    assert row["mfu"] is None and timing.peak_flops() is None  # CPU


@pytest.mark.slow
def test_bench_inference_averages_its_batches():
  rows = inference.run(num_batches=2, batch_size=2, seq_len=16)
  assert [r["arch"] for r in rows] == ["12x768", "6x768", "12x384", "6x384", "4x384", "3x384"]
  assert rows[0]["flop_ratio"] == 1.0 and rows[-1]["flop_ratio"] > 10 and all(r["seconds"] > 0 for r in rows)


@pytest.mark.slow
def test_bench_student_speed_rows_at_a_tiny_size():
  """The thesis's tables 3.2 and 4.4 as `bench student_speed` builds them, at a tiny teacher and
  batch (the README's command is parsed by tests/test_readme_commands.py); the shapes' parameter
  counts against the thesis's and ELMo's published numbers, counted by hand."""
  rows = student_speed.run(batch=2, batches=2, seq_len=8, teacher="2x32", vocab=100)
  names = [name for name, *_ in student_speed.ROWS]
  assert [(r["model"], r["inputs"]) for r in rows] == [
    ("teacher 2x32", "sentences"),
    *[(name, "sentences") for name in names[:3]],
    ("teacher 2x32", "pairs"),
    *[(name, "pairs") for name in names[3:]],
  ]
  by_name = {(r["model"], r["inputs"]): r for r in rows}
  assert all(r["seconds"] > 0 and (r["batch"], r["batches"], r["seq_len"]) == (2, 2, 8) for r in rows)
  assert [r["speedup_over_teacher"] for r in rows if r["model"].startswith("teacher")] == [1.0, 1.0]
  # The BiLSTM (150 units, Dense+ReLU 200, 2 labels) from Flax's LSTM cell: per direction 4 input
  # kernels (300 inputs; 600 with the thesis's two word2vec channels) and 4 hidden kernels with biases.
  lstm = lambda inputs: 2 * (4 * inputs * 150 + 4 * (150 * 150 + 150))
  head = lambda features: features * 200 + 200 + 200 * 2 + 2
  ours, thesis = (by_name[(names[k], "sentences")] for k in (0, 1))
  assert ours["params_M_without_embeddings"] == pytest.approx((lstm(300) + head(300)) / 1e6)
  assert ours["params_M"] == pytest.approx((lstm(300) + head(300) + 100 * 300) / 1e6)
  assert thesis["params_M_without_embeddings"] == pytest.approx((lstm(600) + head(300)) / 1e6)
  assert round(thesis["params_M_without_embeddings"], 2) == 0.96 and "0.96M" in thesis["thesis"]  # table 3.2
  # ELMo's published shape: 16-d characters, 2048 filters of widths 1-7, 2 highway layers, a
  # projection to 512, 4 LSTMs of 4096 cells projected to 512, 3 mixing weights: 93.6M as table 3.2 says.
  convolutions = sum(w * 16 * n + n for w, n in ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)))
  elmo = 262 * 16 + convolutions + 2 * 2 * (2048 * 2048 + 2048) + 2048 * 512 + 512
  elmo += 4 * ((512 + 512) * 4 * 4096 + 4 * 4096 + 4096 * 512) + 3
  assert round(elmo / 1e6, 1) == 93.6
  assert by_name[(names[2], "sentences")]["params_M"] == pytest.approx((elmo + head(1024)) / 1e6)
  assert by_name[(names[-1], "pairs")]["params_M"] == pytest.approx((elmo + head(4 * 1024)) / 1e6)
  # TinyBERT 4x312 without embeddings (its layers and pooler): the thesis's 5.0M; BERT-PKD's 3x768: 21.3M.
  tinybert = by_name[("TinyBERT (4x312)", "pairs")]["params_M_without_embeddings"]
  assert 4.5 < tinybert < 5.0 and "3.68 s" in by_name[("TinyBERT (4x312)", "pairs")]["thesis"]
  assert "BERT-PKD" in by_name[("MKD-Transformer (3x768: BERT-PKD's shape)", "pairs")]["thesis"]


@pytest.mark.slow
def test_bench_generate_rows_at_a_tiny_size():
  rows = generation.run("2x96", batch=2, source_length=8, target_length=4, repeats=1)
  assert [(r["decoder"].split(",")[0], r["beams"]) for r in rows] == [
    ("transformers BertForMaskedLM", 1),
    ("ours", 1),
    ("ours", 5),
  ]
  assert all(r["tokens_per_s"] == pytest.approx(8 / r["seconds"]) for r in rows)
  with pytest.raises(UserError, match="exceed 512 positions"):
    generation.run("2x96", source_length=500, target_length=48)


def test_bench_bad_shapes_are_one_line_errors(capfd):
  proc = run_in_process("bench", "distill", "--seq_len", "12x", capfd=capfd)
  stderr = proc.stderr
  assert proc.returncode == 2 and stderr.count("\n") == 1 and stderr.startswith("error: --seq_len"), proc.stderr
  for kwargs, message in (
    ({"teacher": "12by768"}, "is not LAYERSxHIDDEN"),
    ({"peers": ["jax"]}, "unknown PyTorch peers"),
    ({"case": "huge"}, "unknown distill case"),
  ):
    with pytest.raises(UserError, match=message):
      distill.run(distill.Settings(**kwargs))


@pytest.mark.parametrize(
  "suite, flag",
  [
    ("inference", "--batch=0"),
    ("inference", "--batches=0"),
    ("distill", "--seq_len=0"),
    ("distill", "--repeats=0"),
    ("student_speed", "--seq_len=1"),
    ("inference", "--student=3x"),
    ("distill", "--student="),
  ],
)
def test_bench_counts_below_one_are_one_line(suite, flag, capfd):
  """Checked when the flags are read, before any model is built (`--batch 0` ran the default batch;
  `--batches 0` ended in an IndexError; a length of 1 in a TypeError); a flag the suite does not
  read is refused, not ignored."""
  proc = run_in_process("bench", suite, flag, capfd=capfd)
  stderr = proc.stderr
  assert proc.returncode == 2 and stderr.count("\n") == 1 and flag.split("=")[0] in stderr, proc.stderr[-2000:]


def test_bench_unknown_suite_is_one_line_error():
  """On the command line."""
  proc = subprocess.run([sys.executable, "-m", "minilm_jax.bench", "nope"], capture_output=True, text=True)
  assert proc.returncode == 2 and proc.stderr.strip().startswith("error: name one suite")


@pytest.mark.slow
def test_bench_etd_rows_and_etd_starts_below_random(tiny_corpus):
  """The real all-MiniLM-L6-v2 teacher (no MLM head): ETD-Rand's student starts with a lower MiniLM loss."""
  from minilm_jax.benchmarks import etd

  # Length 32 (the bench's is 128): the start's losses order the inits alike, in 14% less CPU time.
  rows = etd.run(steps=1, batch_size=8, corpus=tiny_corpus, seq_len=32, mesh=parallel.make_mesh(1))
  by = {(r["student"], r["init"]): r for r in rows}
  for student in ("3x384", "3x192"):
    assert by[(student, "etd-rand")]["loss_at_start"] < 0.9 * by[(student, "random")]["loss_at_start"]
    assert by[(student, "etd-impt")]["loss_at_start"] is None and "masked-LM head" in by[(student, "etd-impt")]["note"]
  assert all({"init", "loss_at_start"} <= set(r) for r in rows)


def test_bench_etd_passes_its_steps_and_length_to_the_suite(monkeypatch, capfd):
  """`bench etd --steps --seq_len` through the program: the suite gets both (its rows are the test
  above's); another suite's flag is refused."""
  from minilm_jax.benchmarks import etd

  given = []
  monkeypatch.setattr(etd, "run", lambda steps, seq_len: given.append((steps, seq_len)) or [{"init": "random"}])
  assert run_in_process("bench", "etd", "--steps", "3", "--seq_len", "32", capfd=capfd).returncode == 0
  assert run_in_process("bench", "etd", capfd=capfd).returncode == 0
  assert given == [(3, 32), (20, 128)]
  proc = run_in_process("bench", "etd", "--batch", "8", capfd=capfd)
  assert proc.returncode == 2 and "bench etd does not read --batch" in proc.stderr


@pytest.mark.slow
def test_bench_task_distill_rows(tiny_teacher):
  """The suite's code path on a tiny teacher: a teacher row and the three students, with `model` and `score`."""
  from minilm_jax.benchmarks import task_distill

  settings = task_distill.Settings(
    teacher_init=tiny_teacher,
    teacher_name="tiny BERT",
    teacher_epochs=1,
    epochs=1,
    size_factor=2,
    max_len=24,
    sizes=(16, 8, 16),
    data_dir=WORDNET_SMALL,
  )
  rows = task_distill.run(settings, mesh=parallel.make_mesh(1))
  assert [r["model"].split(":")[0] for r in rows] == [
    "teacher",
    "distilled BiLSTM (logit MSE, augmented 2x)",
    "distilled BiLSTM (logit MSE, no augmentation)",
    "BiLSTM on labels alone",
  ]
  assert all(0 <= r["score"] <= 1 and r["task"] == "wordnet_supersense" for r in rows)
  assert (
    rows[1]["train_examples"]
    > rows[2]["train_examples"]
    == rows[3]["train_examples"]
    == WORDNET_SMALL_TRAIN["wordnet_supersense"]
  )
  assert abs(rows[1]["steps"] - rows[2]["steps"]) <= 0.1 * rows[2]["steps"] and rows[2]["steps"] == rows[3]["steps"]


@pytest.mark.slow
def test_bench_data_rows(tmp_path, capfd):
  """The data suite through the program, at one length: every rate measured, both streams."""
  out = tmp_path / "data.json"
  proc = run_in_process("bench", "data", "--seq_len", "128", "--json", out, capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-2000:]
  (row,) = json.load(open(out))
  assert row["length"] == 128 and row["blocks"] >= 256
  for key in (
    "prepare_tokens_per_s",
    "on_the_fly_blocks_per_s",
    "prepared_blocks_per_s",
    "prepared_x_h100_demand",
    "prepared_to_device_tokens_per_s",  # through the program's prefetch thread onto the mesh
    "prepared_to_device_x_step_goal",
  ):
    assert row[key] > 0
  assert 0.1 < row["GB_per_billion_tokens"] < 10


def _tiny_students_suite(teacher: str, corpus: str, results, **settings):
  """`bench students` at a tiny size (1x32 students, 2 distillation steps of 8 x 32, one epoch of
  fine-tuning) on 2 of the 8 fake devices (the 2 cores run 4x fewer replicas), logging to `results`."""
  from minilm_jax.benchmarks import students

  tiny = dict(steps=2, batch=8, length=32, finetune_epochs=1, finetune_lr=1e-3, corpus=corpus, relation_heads=4)
  given = dict(teacher=teacher, student="1x32", results=str(results), **tiny, **settings)
  mesh = parallel.make_mesh(2)
  return lambda **more: students.run(students.Settings(**{**given, **more}), mesh=mesh)


@pytest.mark.slow
def test_bench_students_rows_at_a_tiny_size(tiny_teacher, tiny_corpus, tmp_path, caplog):
  """Each baseline and recipe distils (or not), is probed frozen and fine-tuned with two seeds on two
  tasks from different sources (WordNet's definitions, VADER's movie reviews), and is ranked; a rerun
  with the same results file measures nothing again, nor does one with another budget for the
  baselines; the same teacher at another path finds the measurements, another teacher at the same
  path does not; a file none of whose entries are of these settings (another version's) says so."""
  import transformers

  from minilm_jax.benchmarks import students

  models = ("teacher", "first_layers", "minilm_etd_embedding")
  tasks = (f"wordnet_supersense={WORDNET_SMALL}", f"vader_movies={VADER_EXCERPT}")
  results = tmp_path / "measured.jsonl"
  suite = _tiny_students_suite(tiny_teacher, tiny_corpus, results, tasks=tasks, seeds=2, models=models)
  rows = suite()
  measured = results.read_text().splitlines()
  assert len(measured) == 3 * 2 * (1 + 2)  # models x tasks x (probe + seeds)
  assert suite() == rows and results.read_text().splitlines() == measured
  assert sorted(os.listdir(tmp_path / "measured_models"))[0].startswith("first_layers_")  # kept for reruns
  probes = suite(seeds=0)  # the frozen probes alone, all from the results file
  assert [r["mean/probe"] for r in probes] == [r["mean/probe"] for r in rows] and "mean/ft" not in probes[0]
  assert results.read_text().splitlines() == measured
  # What the file holds, measuring nothing: a third seed is missing on each task of each row.
  logged = suite(seeds=3, logged_only=True)
  assert results.read_text().splitlines() == measured
  for row, full in zip(logged, rows):
    assert row["ft_missing"] == 2 and "mean/ft" not in row and row["mean/probe"] == full["mean/probe"]
    assert [row[f"vader_movies/{k}"] for k in ("ft", "ft_std")] == [full[f"vader_movies/{k}"] for k in ("ft", "ft_std")]
  assert "ft_missing" not in suite(logged_only=True)[0]
  # The same teacher in another checkout or venv: its measurements, known by what the teacher holds.
  moved = tmp_path / "another_venv" / "teacher"
  shutil.copytree(tiny_teacher, moved)
  assert suite(teacher=str(moved), logged_only=True) == rows
  with pytest.raises(UserError, match="--logged_only prints what a --results file holds: give its --results"):
    suite(results="", logged_only=True)
  # The baselines are not distilled: another budget or corpus reuses their scores.
  other_corpus = tmp_path / "other_corpus.txt"
  other_corpus.write_text("Another corpus, which the baselines never read.\n", encoding="utf-8")
  suite(steps=3, corpus=str(other_corpus), models=models[:2])
  assert results.read_text().splitlines() == measured
  # A later run that measures a distilled student again (a third seed) finds it distilled in moments:
  # its row keeps the time the distillation took (here a logged 33.6 minutes).
  entries = [json.loads(line) for line in measured]
  for entry in entries:
    entry["distill_minutes"] = 33.6 if json.loads(entry["key"])[0]["distill"] else 0.0
  results.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
  # (there: its kept distilled student resumes from the teacher at another path, the same weights)
  (again,) = suite(seeds=3, models=models[2:], tasks=tasks[:1], teacher=str(moved))
  assert again["distill_min"] == 33.6 and len(results.read_text().splitlines()) == len(measured) + 1
  # and this process's CPU time beside the wall-clock minutes: comparable when the suite shared the machine
  assert again["ft_cpu_min"] > 0 and "distill_cpu_min" in again
  # Seeds from a given one (a host adding to rows whose first seeds were measured elsewhere): seed 3 alone.
  (added,) = suite(seeds=1, first_seed=3, models=models[2:], tasks=tasks[:1])
  (entry,) = [json.loads(line) for line in results.read_text().splitlines()[len(measured) + 1 :]]
  assert json.loads(entry["key"])[2] == 3 and added["wordnet_supersense/ft"] == pytest.approx(entry["value"], abs=1e-4)
  assert "none of the" not in caplog.text
  # Another version's file: its keys name settings this version does not have.
  older = tmp_path / "older.jsonl"
  keyed = [(json.loads(e["key"]), e) for e in entries]
  older.write_text("".join(json.dumps({**e, "key": json.dumps([{**k[0], "old": 1}, *k[1:]])}) + "\n" for k, e in keyed))
  older_again = tmp_path / "older_again.jsonl"
  older_again.write_text(older.read_text())
  with caplog.at_level("WARNING"):
    suite(results=str(older), seeds=0, models=models[:1], tasks=tasks[:1])
  assert f"none of the {len(entries)} measurements in {older} is of these models and settings" in caplog.text
  # ... which --logged_only, measuring nothing, refuses (it said every row would be measured again).
  one = dict(seeds=0, models=models[:1], tasks=tasks[:1], logged_only=True)
  with pytest.raises(UserError, match=f"--logged_only: none of the {len(entries)} measurements in .* run without"):
    suite(results=str(older_again), **one)
  with pytest.raises(UserError, match="--logged_only: .*missing.jsonl holds no measurements"):  # was silent
    suite(results=str(tmp_path / "missing.jsonl"), **one)
  garbage = tmp_path / "garbage.jsonl"
  garbage.write_bytes(bytes(range(256)))
  with pytest.raises(UserError, match="garbage.jsonl:1 is not a line this suite wrote"):  # were tracebacks
    suite(results=str(garbage), **one)
  with pytest.raises(UserError, match=f"--results {tmp_path} is a folder: name a JSON Lines file"):
    suite(results=str(tmp_path), **one)
  # Another teacher put at a path that held one: none of its measurements (they were reused).
  retrained = transformers.BertModel.from_pretrained(moved)
  with torch.no_grad():
    retrained.embeddings.word_embeddings.weight[5] += 0.01
  retrained.save_pretrained(moved)
  with pytest.raises(UserError, match=f"--logged_only: none of the {len(entries) + 2} measurements in .* run without"):
    suite(teacher=str(moved), **one)
  assert [r["model"] for r in rows] == list(models)
  assert [r["distill_tokens"] for r in rows] == [0, 0, 2 * 8 * 32]
  for r in rows:
    for task in ("wordnet_supersense", "vader_movies"):
      assert 0.0 <= r[f"{task}/ft"] <= 1.0 and r[f"{task}/ft_std"] >= 0.0 and 0.0 <= r[f"{task}/probe"] <= 1.0
    assert r["mean/ft"] == pytest.approx((r["wordnet_supersense/ft"] + r["vader_movies/ft"]) / 2, abs=1e-4)
  assert sorted(r["ft_rank"] for r in rows) == sorted(r["probe_rank"] for r in rows) == [1, 2, 3]
  assert "ft_gap_closed" in rows[2] and "ft_gap_closed" not in rows[0]
  with pytest.raises(UserError, match="unknown students \\['bogus'\\]"):
    students.run(students.Settings(teacher=tiny_teacher, student="1x32", models=("bogus",)))
  with pytest.raises(UserError, match="vader_tweets read vaderSentiment's source package|VADER tasks read"):
    students.run(students.Settings(teacher=tiny_teacher, student="1x32", tasks=("vader_tweets",), models=("teacher",)))
  with pytest.raises(UserError, match="--tasks squad1: the suite fine-tunes classification and regression tasks"):
    students.run(students.Settings(teacher=tiny_teacher, student="1x32", tasks=("squad1",), models=("teacher",)))


def test_every_row_built_on_a_first_stage_reports_the_time_its_distillation_took(tmp_path):
  """A second stage measured after the `+long` row, whose run distilled their common first stage,
  finds the student distilled in moments: its row reports the time the `+long` row's run logged."""
  from minilm_jax.benchmarks.students.log import MeasurementLog, Spent

  distilled = {"distill": {"num_steps": 500}, "teacher": "all-MiniLM-L6-v2"}
  finetuning = {"finetune_epochs": 3, "finetune_lr": 1e-4, "length": 64}
  long = {**distilled, **finetuning, "second_stage": {"steps_of": "embedding_etd_lr5e4+task_kd"}}
  second = {**distilled, **finetuning, "second_stage": {"layers": "tinybert_layerwise", "augment": True}}
  path = str(tmp_path / "measured.jsonl")
  MeasurementLog(path).add((long, "vader_movies=", 0), 0.789, Spent(15.2, 29.8), Spent(3.1, 5.9))
  log = MeasurementLog(path)  # a later run, reading the file
  assert log.distillation_spent(second) == log.distillation_spent({**distilled, **finetuning}) == Spent(15.2, 29.8)
  assert log.distillation_spent({**second, "teacher": "another teacher"}) == Spent(0.0, None)
  assert log[(long, "vader_movies=", 0)]["cpu_minutes"] == 5.9


def test_measurements_are_keyed_by_what_their_inputs_hold(tmp_path, caplog):
  """`bench students --results` names the teacher, the corpus and a task's data by their bytes: the
  same teacher in another checkout or venv finds its measurements and kept models, another teacher
  put at the same path does not. A file whose keys named them by path (earlier versions) is written
  again once, its model folders renamed, the file as it was kept beside it."""
  import hashlib

  from minilm_jax.benchmarks.students.log import MeasurementLog

  teacher, data, corpus = tmp_path / "venv" / "teacher", tmp_path / "task.tsv", tmp_path / "corpus.txt"
  teacher.mkdir(parents=True)
  (teacher / "model.safetensors").write_bytes(b"weights")
  data.write_text("a review\t1\n")
  corpus.write_text("A sentence.\n")

  def keys(teacher_path):
    distill = {"teacher": {"path": str(teacher_path)}, "data": {"corpus": str(corpus)}}
    distilled = {"distill": distill, "teacher": str(teacher_path)}
    return distilled, ({**distilled, "finetune_epochs": 3}, f"vader_movies={data}", 0)

  distilled, measured = keys(teacher)
  path = tmp_path / "measured.jsonl"
  # As an earlier version wrote them: the key names the inputs by path, and so does the model's folder.
  by_path = json.dumps({"key": json.dumps(measured, sort_keys=True), "value": 0.75, "distill_minutes": 1.0}) + "\n"
  path.write_text(by_path)
  folder = (
    tmp_path
    / "measured_models"
    / f"student_{hashlib.sha256(json.dumps(distilled, sort_keys=True).encode()).hexdigest()[:12]}"
  )
  folder.mkdir(parents=True)
  with caplog.at_level("WARNING"):
    log = MeasurementLog(str(path))
  assert "1 measurements in" in caplog.text and "named their teacher, corpus or task data by path" in caplog.text
  assert log[measured]["value"] == 0.75 and (tmp_path / "measured.by_path.jsonl").read_text() == by_path
  (stored,) = path.read_text().splitlines()
  assert stored.count("sha256:") == 4 and str(tmp_path) not in stored  # the teacher twice, the corpus, the task's data
  kept = log.model_dir(str(tmp_path), "student", distilled)
  assert os.path.isdir(kept) and not folder.exists()
  # The same bytes in another checkout: its measurements and its model, and the file left as it is.
  elsewhere = tmp_path / "other_checkout" / "teacher"
  shutil.copytree(teacher, elsewhere)
  log = MeasurementLog(str(path))
  assert path.read_text().splitlines() == [stored]
  distilled_elsewhere, measured_elsewhere = keys(elsewhere)
  assert log[measured_elsewhere]["value"] == 0.75
  assert log.model_dir(str(tmp_path), "student", distilled_elsewhere) == kept
  # Another teacher at the first path, another line in the corpus: measured anew, in another folder.
  (teacher / "model.safetensors").write_bytes(b"other weights")
  assert measured not in MeasurementLog(str(path)) and measured_elsewhere in MeasurementLog(str(path))
  assert MeasurementLog(str(path)).model_dir(str(tmp_path), "student", distilled) != kept
  corpus.write_text("A sentence.\nAnother.\n")
  assert measured_elsewhere not in MeasurementLog(str(path))


@pytest.mark.slow
def test_bench_students_second_stages_at_a_tiny_size(tiny_teacher, tiny_corpus, tmp_path, caplog):
  """A second stage (the teacher's logits and layers on the augmented set, from the evenly spaced
  layers), one learning three teachers (the teacher fine-tuned with seeds 0, 1, 2) with the score
  of their mean logits, and a first stage fine-tuned for the second stage's steps: all scored and
  ranked against the teacher, whose seed-0 fine-tuning is the kept teacher run; the augmented set
  and each teacher's logits are cached beside the models, and a rerun measures nothing again."""
  from minilm_jax.finetuning.teachers import find_teachers, teacher_logits
  from minilm_jax.tasks import get_task

  several = ("teacher_ensemble3", "embedding_etd_lr5e4+task_kd_teachers3")
  models = ("teacher", "uniform_layers", "uniform_layers+task_kd", "embedding_etd_lr5e4+long", *several)
  results = tmp_path / "measured.jsonl"
  tasks = (f"vader_movies={VADER_EXCERPT}",)  # 219 training reviews: the smallest task of the suite
  suite = _tiny_students_suite(tiny_teacher, tiny_corpus, results, tasks=tasks, seeds=1, models=models, size_factor=2)
  rows = suite()
  measured = results.read_text().splitlines()
  # the first stages' probe and seed, the second stages' seed, the ensemble's score
  assert len(measured) == 2 * 2 + 2 + 2
  assert suite() == rows and results.read_text().splitlines() == measured
  kept = sorted(os.listdir(tmp_path / "measured_models"))
  teacher_runs = [os.path.join(tmp_path, "measured_models", k) for k in kept if k.startswith("teacher_vader_movies")]
  assert len(teacher_runs) == 3, kept  # seeds 0, 1, 2: kept for the second stage that learns them
  cached = sorted(os.listdir(tmp_path / "measured_models" / "cache"))
  # the augmented set, each teacher's logits on it and on the dev set (the ensemble's)
  assert sorted(os.path.splitext(c)[1] for c in cached) == [".npy"] * 6 + [".parquet"], cached
  # A machine without the kept runs fine-tunes one again when a measurement needs it (here the
  # ensemble's, taken out of the log), and says so where it scores otherwise than the logged seed.
  shutil.rmtree(teacher_runs[0])  # seed 0's: the names of seeds 1 and 2 sort after it
  entries = [json.loads(line) for line in measured]
  logged = [e for e in entries if json.loads(e["key"])[2] == 0 and json.loads(e["key"])[0]["distill"] is None]
  assert len(logged) == 1
  logged[0]["value"] += 0.25  # as another machine's run of seed 0 scored
  results.write_text("".join(json.dumps(e) + "\n" for e in entries if json.loads(e["key"])[2] != several[0]))
  with caplog.at_level("WARNING"):
    again = {r["model"]: r for r in suite(models=("teacher", several[0]))}
  assert os.path.isfile(os.path.join(teacher_runs[0], "results.json"))
  assert "the teacher fine-tuned again on vader_movies with seed 0 scores" in caplog.text
  assert again["teacher"]["vader_movies/ft"] == pytest.approx(logged[0]["value"], abs=1e-4)  # the row: the log's
  ensemble_again = again[several[0]]["vader_movies/ft"]
  by_model = {r["model"]: r for r in rows}
  for name in models:
    assert 0.0 <= by_model[name]["vader_movies/ft"] <= 1.0
  assert all(by_model[name]["ft_min"] > 0 for name in models if name not in several[:1])
  # The ensemble's score: the three teachers' mean logits on the dev set, scored here with numpy.
  task = get_task("vader_movies")
  dev = task.load("dev", VADER_EXCERPT)
  mesh = parallel.make_mesh(2)
  mean = np.mean(
    [
      teacher_logits(find_teachers([r], [task])[task.name], task, dev, 32, 64, mesh, str(tmp_path))
      for r in teacher_runs
    ],
    axis=0,
  )
  ensemble = np.mean(mean.argmax(-1) == np.asarray(dev["label"]))
  assert by_model["teacher_ensemble3"]["vader_movies/ft"] == pytest.approx(ensemble, abs=1e-4)
  assert ensemble_again == pytest.approx(ensemble, abs=1e-4)  # this machine's refit: its first run again
  assert "ft_gap_closed" in by_model["uniform_layers+task_kd"] and "vader_movies/probe" not in by_model[models[2]]
  # The longer one-stage row trains as many epochs as the augmented set is times the training set.
  long_runs = [json.loads(line) for line in measured if "steps_of" in line]
  assert len(long_runs) == 1
  # The lever row: the same three teachers on twice the augmented copies, a set of its own (cached
  # beside the first), more than the first's cap of twice the training set.
  import pyarrow.parquet as pq

  (lever,) = suite(models=("embedding_etd_lr5e4+task_kd_teachers3_copies2x",))
  assert 0.0 <= lever["vader_movies/ft"] <= 1.0
  sets = [c for c in os.listdir(tmp_path / "measured_models" / "cache") if c.endswith(".parquet")]
  rows = sorted(len(pq.read_table(tmp_path / "measured_models" / "cache" / c)) for c in sets)
  assert len(rows) == 2 and rows[0] <= 2 * 219 < rows[1] <= 4 * 219, rows


@pytest.mark.slow
def test_a_second_stage_stopped_by_sigterm_resumes_to_the_score_of_an_unstopped_one(
  tiny_teacher, tiny_corpus, tmp_path, monkeypatch, caplog
):
  """A suite stopped by SIGTERM in the middle of a second stage (a measurement of hours whose sitting
  ends) leaves that run's checkpoint beside the models; the same command resumes it from there and
  logs the score an unstopped run logs, saying from which step (its minutes are the rerun's part
  alone, left out of the row's), then removes the checkpoints and keeps the run's results."""
  from minilm_jax.errors import Preempted
  from minilm_jax.training import loop

  settings = dict(tasks=(f"vader_movies={VADER_EXCERPT}",), seeds=1, size_factor=2)
  row = "uniform_layers+task_kd"
  (unstopped,) = _tiny_students_suite(
    tiny_teacher, tiny_corpus, tmp_path / "unstopped.jsonl", models=(row,), **settings
  )()
  results = tmp_path / "stopped.jsonl"
  suite = partial(_tiny_students_suite(tiny_teacher, tiny_corpus, results, **settings), models=(row,))
  suite(models=("teacher",))  # the kept teacher run: the second stage's fine-tuning is then the only loop
  stop_at, signalled = loop._Preemption.stop_at, []

  def sigterm_at_step_3(preemption, step):
    if step == 3 and not signalled:
      signalled.append(step)
      os.kill(os.getpid(), signal.SIGTERM)  # the loop's own handler records it
    return stop_at(preemption, step)

  monkeypatch.setattr(loop._Preemption, "stop_at", sigterm_at_step_3)
  with pytest.raises(Preempted, match="saved the checkpoint of step 3"):
    suite()
  assert len(results.read_text().splitlines()) == 2  # the teacher row's probe and seed alone
  (run_dir,) = glob.glob(str(tmp_path / "stopped_models" / f"{row}_vader_movies_0_*"))
  assert runs.RunCheckpoints(run_dir, read_only=True).latest_step() == 3
  with caplog.at_level("WARNING"):
    (resumed,) = suite()
  assert f"the fine-tuning in {run_dir} resumes from its step 3" in caplog.text
  entry = json.loads(results.read_text().splitlines()[-1])
  whole = json.loads((tmp_path / "unstopped.jsonl").read_text().splitlines()[-1])
  assert entry["resumed_from_step"] == 3 and entry["value"] == whole["value"] and "resumed_from_step" not in whole
  assert resumed["vader_movies/ft"] == unstopped["vader_movies/ft"] and "ft_min" not in resumed
  assert not runs.is_run(run_dir) and os.path.isfile(os.path.join(run_dir, "results.json"))


@pytest.mark.slow
def test_bench_students_through_the_program(tiny_teacher, tmp_path, capfd):
  """The suite as users call it: flags to rows, the probe and fine-tuning on the program's mesh, on
  tasks of each kind the default runs: one sentence (probed too), sentence pairs and a regression
  (fine-tuned alone: a probe's examples are right or wrong)."""
  out = tmp_path / "students.json"
  proc = run_in_process(
    "bench",
    "students",
    "--teacher",
    tiny_teacher,
    "--models",
    "teacher",
    "--tasks",
    f"vader_tweets={VADER_EXCERPT},wordnet_examples={WORDNET_SMALL},vader_movies_rating={VADER_EXCERPT}",
    "--seeds",
    "1",
    "--epochs",
    "1",
    "--seq_len",
    "16",
    "--json",
    str(out),
    capfd=capfd,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  (row,) = json.load(open(out))
  assert row["model"] == "teacher" and 0 <= row["vader_tweets/probe"] <= 1 and row["vader_tweets/ft_std"] == 0
  assert 0 <= row["wordnet_examples/ft"] <= 1 and -1 <= row["vader_movies_rating/ft"] <= 1  # accuracy, Pearson
  assert row["wordnet_examples/probe"] is None and row["vader_movies_rating/probe"] is None
  assert row["ft_within_noise_of"] == "unknown (one seed)"
  assert row["probe_within_noise_of"] == "-"  # a probe has no seeds: its claim needs none
  assert "teacher" in proc.stdout and "vader_tweets/ft" in proc.stdout


def test_a_distilled_models_key_holds_what_it_learnt_not_the_devices_it_ran_on():
  """The devices a distillation splits its batch over are not in its measurements' key: the key is
  the same at any `mesh.data`, and has the fields of the keys this project's results file holds
  (logged before the distillation config had `mesh`), so that a rerun finds those measurements."""
  from minilm_jax.benchmarks.students.suite import measured_settings
  from minilm_jax.distill.config import base_config

  one, all_devices = base_config(), base_config()
  one.mesh.data = 1
  assert measured_settings(one) == measured_settings(all_devices) and "mesh" not in measured_settings(one)
  with open(os.path.join(ROOT, "docs", "students_cpu.jsonl")) as f:
    logged = [json.loads(json.loads(line)["key"])[0]["distill"] for line in f]
  distilled = [d for d in logged if d is not None]
  assert distilled and all(d.keys() == measured_settings(one).keys() for d in distilled)


def test_bench_students_ranks_and_noise():
  """Ranks by the mean over tasks; within noise means closer than twice the standard error of the
  difference (from the seeds for fine-tuning; paired by dev example for the probe, McNemar's error);
  the share of the gap from the better layer-dropping baseline to the teacher."""
  from minilm_jax.benchmarks.students.scores import ModelScores, probe_difference_error, rank

  def right(*spans):  # a probe that gets the dev examples in `spans` right, of 1,000
    correct = np.zeros(1000, bool)
    for start, stop in spans:
      correct[start:stop] = True
    return correct

  def model(name, ft_a, ft_b, probe):
    m = ModelScores(name, "3x384", 0)
    m.finetuned = {"a": ft_a, "b": ft_b}
    m.probe = {"a": probe, "b": None}  # b: a sentence-pair task, no probe
    return m

  models = [
    model("teacher", [0.90, 0.92, 0.91], [0.80, 0.80, 0.80], right((0, 900))),
    model("first_layers", [0.70, 0.70, 0.70], [0.60, 0.60, 0.60], right((0, 700))),
    model("uniform_layers", [0.80, 0.80, 0.80], [0.70, 0.70, 0.70], right((0, 800))),
    # 0.8 on average, one seed far off: within noise of uniform_layers though its mean is higher;
    # its probe gets 0.81 with 40 examples lost and 50 won against uniform_layers' 0.80
    model("minilm_etd", [0.80, 0.90, 0.80], [0.70, 0.75, 0.71], right((0, 760), (800, 850))),
    # the same 0.81 with 10 examples won and none lost: beyond the paired noise, though 0.81 and
    # 0.80 on 1,000 examples are within two unpaired sampling errors (2 x 0.018)
    model("minilm_random", [0.50, 0.50, 0.50], [0.50, 0.50, 0.50], right((0, 810))),
  ]
  rows = rank(models, ["a", "b"])
  by = {r["model"]: r for r in rows}
  order = ("teacher", "minilm_etd", "uniform_layers", "first_layers", "minilm_random")
  assert [by[m]["ft_rank"] for m in order] == [1, 2, 3, 4, 5]
  per_seed = np.mean([[0.80, 0.90, 0.80], [0.70, 0.75, 0.71]], axis=0)
  assert by["minilm_etd"]["mean/ft_std"] == pytest.approx(np.std(per_seed, ddof=1), abs=1e-4)
  assert by["minilm_etd"]["ft_within_noise_of"] == "uniform_layers"
  assert by["first_layers"]["ft_within_noise_of"] == "-"  # no spread: any difference is beyond noise
  gap = by["minilm_etd"]["ft_gap_closed"]
  assert gap == pytest.approx((per_seed.mean() - 0.75) / (0.855 - 0.75), abs=0.01)
  # McNemar's standard error of a paired difference from its discordant counts (won w, lost l of n)
  mcnemar = lambda w, l, n=1000: np.sqrt((w + l - (w - l) ** 2 / n) / (n - 1) / n)
  assert probe_difference_error(models[3], models[2]) == pytest.approx(mcnemar(50, 40))
  assert probe_difference_error(models[4], models[2]) == pytest.approx(mcnemar(10, 0))
  assert set(by["minilm_etd"]["probe_within_noise_of"].split(",")) == {"uniform_layers", "minilm_random"}
  assert by["minilm_random"]["probe_within_noise_of"] == "minilm_etd"
  assert by["minilm_etd"]["probe_gap_closed"] == pytest.approx(0.1, abs=1e-6)
  assert by["teacher"]["mean/probe"] == 0.9 and by["teacher"]["b/probe"] is None
  # a teacher fine-tuned with one seed: the others' comparisons with it are unknown, not ties
  models[0].finetuned = {"a": [0.91], "b": [0.80]}
  by = {r["model"]: r for r in rank(models, ["a", "b"])}
  assert by["teacher"]["ft_within_noise_of"] == "unknown (one seed)"
  assert by["minilm_etd"]["ft_within_noise_of"] == "uniform_layers; unknown (one seed): teacher"


def test_every_student_recipe_builds_its_distillation_step(tiny_teacher, tiny_corpus):
  """Each recipe of `bench students` is a valid distillation config: its step builds on the teacher
  (objective, layers, relation heads checked), as the suite's distillation will build it."""
  from minilm_jax.benchmarks import students
  from minilm_jax.benchmarks.students import recipes
  from minilm_jax.distill.step import LONE, build_train_step
  from minilm_jax.models.embeddings import Pooling

  teacher_config = runs.encoder_config_of(tiny_teacher)
  for name, recipe in recipes.RECIPES.items():
    settings = students.Settings(
      models=(name,),
      teacher=tiny_teacher,
      student="1x32",
      steps=4,
      batch=8,
      length=32,
      corpus=tiny_corpus,
      relation_heads=4,
    )
    config = recipes.student_config(name, teacher_config, settings)
    mesh = parallel.make_mesh(1)
    build = partial(
      build_train_step, {LONE: config}, teacher_config, mesh, masking=Masking(), poolings={LONE: Pooling()}
    )
    if teacher_config.hidden_size % recipe.get("relation_heads", 4):  # MiniLMv2's 48 heads: 384-wide models
      with pytest.raises(UserError, match="num_relation_heads=48 does not divide hidden size"):
        build()
      continue
    step = build().students[LONE]
    assert step.student.config.num_layers == 1 and config.num_steps == 4, name


def test_each_device_kind_finds_its_chip_in_the_one_table():
  """The benchmarks' peak FLOP/s come from `devices/chips.py`'s table, the one aot compiles from: a
  device kind JAX reports finds its row by the longest name it starts with."""
  from minilm_jax.devices.chips import CHIPS

  for kind, chip in (
    ("TPU v5 lite", "v5e"),
    ("TPU v5", "v5p"),
    ("TPU v6 lite", "v6e"),
    ("TPU v4", "v4"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
  ):
    assert timing.chip_of(kind) is CHIPS[chip], kind
  assert timing.chip_of("cpu") is None and timing.peak_flops() is None  # this host's CPU


@pytest.mark.slow
def test_bench_distill_profiles_where_the_step_time_goes(tmp_path):
  """`bench distill --profile` on a CPU trace: for each profiled step every part of the step gets a
  row; the teacher, the student's forward and backward, the relations and the optimizer each took
  time; the parts that ran get their analytic TFLOP/s; the idle time is what no operation covered.
  The table is written beside the trace, and a second profile into the same folder is refused."""
  from minilm_jax.benchmarks import profile

  out = tmp_path / "profiles"
  distill.run(distill.Settings("cpu", 1, "float32", "2x64", ["2x32"], 4, [32], [], 0, str(out)))
  table = json.loads((out / "2x32_32" / "parts.json").read_text())
  assert [r["part"] for r in table] == list(profile.PARTS) * distill.PROFILED_STEPS
  assert {r["step"] for r in table} == set(range(distill.PROFILED_STEPS))
  for step in range(distill.PROFILED_STEPS):
    part = {r["part"]: r for r in table if r["step"] == step}
    for name in ("teacher forward", "student dense forward", "student dense backward", "relation KL forward"):
      assert part[name]["ms"] > 0 and part[name]["TFLOP/s"] > 0 and part[name]["GB/s"] > 0, part[name]
    assert part["optimizer update"]["ms"] > 0 and 0 <= part["idle"]["share"] < 1
  assert glob.glob(str(out / "2x32_32" / "plugins" / "profile" / "*" / "*.trace.json.gz"))
  with pytest.raises(UserError, match="--profile .* already holds"):
    distill.run(distill.Settings("cpu", 1, "float32", "2x64", ["2x32"], 4, [32], [], 0, str(out)))


def test_the_profile_parts_follow_the_name_stack_and_the_kernels():
  """A GPU's kernels named as ours, the transformations JAX writes into each instruction's name
  stack, and a step's idle time from a trace's device events (their `hlo_op`)."""
  from minilm_jax.benchmarks import profile
  from minilm_jax.kernels import attention, relation_kl

  assert profile.part_of("jit(step)/teacher/Encoder/layer_3/attention/dot_general") == "teacher forward"
  assert profile.part_of("jit(step)/jvp(Encoder)/layer_0/intermediate/dot_general") == "student dense forward"
  assert profile.part_of("jit(step)/transpose(jvp(Encoder))/layer_0/output/dot_general") == "student dense backward"
  assert profile.part_of("jit(step)/optimizer/mul") == "optimizer update"
  assert profile.part_of("jit(step)/transpose(jvp(jit(log_softmax)))/sub") == "relation KL backward"
  assert profile.part_of("jit(step)/threefry2x32") == "other"
  call = 'custom-call(...), custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":"%s"}'
  for kernel, part in ((attention, "attention kernel"), (relation_kl, "relation KL")):
    assert profile.part_of("jit(step)/jvp(Encoder)/x", call % kernel.FORWARD) == f"{part} forward"
    assert profile.part_of("jit(step)/transpose(jvp(Encoder))/x", call % kernel.BACKWARD) == f"{part} backward"
  hlo = (
    '  %fusion.1 = bf16[8,128]{1,0} fusion(bf16[8,64]{1,0} %p), metadata={op_name="jit(step)/teacher/Encoder/dot"}\n'
    '  %fusion.2 = f32[4]{0} fusion(f32[4]{0} %q), metadata={op_name="jit(step)/optimizer/add"}\n'
  )
  assert profile.instructions(hlo) == {"fusion.1": ("teacher forward", 3072), "fusion.2": ("optimizer update", 32)}
  device = {"ph": "X", "pid": 2, "tid": 7}
  trace = {
    "traceEvents": [
      {"ph": "X", "pid": 1, "tid": 1, "name": profile.STEP, "ts": 0.0, "dur": 100.0},
      {**device, "name": "loop_fusion_kernel", "ts": 10.0, "dur": 30.0, "args": {"hlo_op": "fusion.1"}},
      {**device, "name": "loop_fusion_kernel_2", "ts": 30.0, "dur": 20.0, "args": {"hlo_op": "fusion.2"}},
      {**device, "name": "memcpy", "ts": 60.0, "dur": 5.0, "args": {}},
    ]
  }
  part = {r["part"]: r for r in profile.step_table(trace, hlo, {"teacher forward": 3e6})}
  assert part["teacher forward"]["ms"] == pytest.approx(0.03) and part["teacher forward"]["TFLOP/s"] == pytest.approx(
    0.1
  )
  assert part["teacher forward"]["GB/s"] == pytest.approx(3072 / 30e-6 / 1e9)
  assert part["optimizer update"]["ms"] == pytest.approx(0.02)
  assert part["idle"]["ms"] == pytest.approx(0.06)  # 100 us less the 10..50 the two operations covered
