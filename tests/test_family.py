"""A family of students distilled from one teacher in one run (`distill.family`): each student ends
as it would alone, one checkpoint holds them all, one exports, and a config that cannot run is one
line before any work."""

import dataclasses
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from conftest import ROOT, run_in_process, tiny_config
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.distill import family
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError

# Three students of other depths, widths, objectives, rates and dropout; one learns the teacher's
# first layer (the teacher then runs as deep as the others need: its last).
STUDENTS = (
  dict(name="2x16", student=dict(dropout=0.1)),
  dict(name="1x32", student=dict(num_layers=1, hidden_size=32, intermediate_size=64), optimizer=dict(lr=5e-4)),
  dict(name="3x16", student=dict(num_layers=3), loss=dict(objective="hidden_mse"), teacher=dict(layer=0)),
)


def _family_config(teacher, corpus, students=STUDENTS, **overrides):
  c = tiny_config(teacher, corpus, **{"num_steps": 4, **overrides})
  with c.unlocked():
    c.family = students
  return c


def _check_one_students_run(workdir: str, state):
  """A run of one student is as it was before families: its record has no `students`, its state's
  parameters are the encoder's own (no student key above them), its metrics carry no student's name."""
  from minilm_jax.runs.checkpoints import RunCheckpoints

  assert {"embeddings", "layer_0"} <= set(state.params) and "" not in state.params
  ckpt = RunCheckpoints(workdir, read_only=True)
  meta = ckpt.manager.restore(ckpt.latest_step(), args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
  ckpt.close()
  assert "students" not in meta and meta["kind"] == "distillation"
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert all("/" not in key for key in rows[-1]) and {"loss", "grad_norm", "lr", "skipped"} <= set(rows[-1])


def _flat(params) -> dict:
  return traverse_util.flatten_dict(jax.device_get(params), sep="/")


@pytest.mark.slow
def test_each_student_of_a_family_ends_as_it_would_alone_and_exports(tiny_teacher, tiny_corpus, tmp_path):
  """On the 8 fake devices, 4 steps, stopped after 2 and resumed: every student's parameters equal
  those of the student distilled alone from its own config without a stop (same seed, same batches;
  each lone run as runs were before families), its metrics are logged under its name, and its export
  (`convert --to-hf --student`'s) equals the lone run's export."""
  mesh = parallel.make_mesh()
  assert mesh.shape[parallel.DATA] == 8
  half = _family_config(tiny_teacher, tiny_corpus, num_steps=2, **{"checkpoint.every": 2})
  assert int(build_distillation(half, str(tmp_path / "family"), mesh=mesh).run().step) == 2
  config = _family_config(tiny_teacher, tiny_corpus)
  family_state = build_distillation(config, str(tmp_path / "family"), mesh=mesh).run()
  assert int(family_state.step) == 4
  for name, member in family.members(config).items():
    alone = build_distillation(member, str(tmp_path / name), mesh=mesh).run()
    _check_one_students_run(str(tmp_path / name), alone)
    theirs, ours = _flat(alone.params), _flat(family_state.params[name])
    assert theirs.keys() == ours.keys()
    for key in theirs:
      np.testing.assert_allclose(ours[key], theirs[key], rtol=2e-5, atol=2e-6, err_msg=f"{name}: {key}")
  rows = [json.loads(line) for line in open(tmp_path / "family" / "metrics.jsonl")]
  assert {"loss", "2x16/loss", "1x32/loss", "3x16/loss", "3x16/loss_hidden_mse", "1x32/lr"} <= set(rows[-1])
  assert rows[-1]["loss"] == pytest.approx(sum(rows[-1][f"{n['name']}/loss"] for n in STUDENTS), rel=1e-5)
  record = runs.read_record(str(tmp_path / "family"))
  assert list(record.students) == ["2x16", "1x32", "3x16"] and record.encoder is None
  with pytest.raises(UserError, match="holds a family of students"):
    runs.load_encoder(str(tmp_path / "family"))

  for workdir, student, out in (("family", "1x32", "from_family"), ("1x32", None, "alone")):
    config, _ = runs.export_run(str(tmp_path / workdir), str(tmp_path / out), student=student)
    assert (config.num_layers, config.hidden_size) == (1, 32)
  with pytest.raises(UserError, match="holds one student, not a family: leave --student out"):
    runs.export_run(str(tmp_path / "1x32"), str(tmp_path / "refused"), student="1x32")
  exported = [runs.load_encoder(str(tmp_path / out)) for out in ("from_family", "alone")]
  assert exported[0].config == exported[1].config
  for key, value in _flat(exported[1].params).items():
    np.testing.assert_allclose(_flat(exported[0].params)[key], value, rtol=2e-5, atol=2e-6, err_msg=key)


@pytest.mark.slow
def test_each_student_is_evaluated_under_its_name_and_summarised_at_the_end(
  tiny_teacher, tiny_corpus, tmp_path, capsys
):
  """A family's evaluators run for every student, logged as <name>/eval/...; the teacher is scored
  once for all of them; the run ends with each student's table (the teacher, its start, its last
  step), as a lone run ends with its own."""
  from conftest import SENTENCES
  from minilm_jax.evaluation.evaluators import evaluator

  sts = tmp_path / "sts.tsv"
  pairs = zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])
  sts.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{i % 5}.0\n" for i, (a, b) in enumerate(pairs)))
  config = _family_config(tiny_teacher, tiny_corpus, STUDENTS[:2], num_steps=2, **{"data.heldout_blocks": 8})
  config.eval_batch_size = 8
  config.evaluators.heldout = evaluator("heldout", 2)
  config.evaluators.sts = evaluator("sts", 2, file=str(sts), max_seq_length=16)
  run = build_distillation(config, str(tmp_path / "family"), mesh=parallel.make_mesh(2))
  teacher_scorings = []
  for student in run.students.values():  # every teacher scoring of every student's evaluators, counted
    for e in student.evaluators.items:
      if e.teacher is not None:
        e.teacher = lambda score=e.teacher, name=e.name: teacher_scorings.append(name) or score()
  run.run()
  assert teacher_scorings == ["sts"]  # the teacher is scored once for the family, not once a student
  rows = [json.loads(line) for line in open(tmp_path / "family" / "metrics.jsonl")]
  evaluated = {k for r in rows if r["step"] == 2 for k in r}
  for name in ("2x16", "1x32"):  # each student's metrics still carry the teacher's row
    assert any(f"{name}/eval/sts/teacher/spearman" in r for r in rows), name
  for name in ("2x16", "1x32"):
    assert {f"{name}/eval/heldout/loss", f"{name}/eval/sts/spearman"} <= evaluated, sorted(evaluated)
  out = capsys.readouterr().out
  for name in ("2x16", "1x32"):
    table = out[out.index(f"{name}:\n") :]
    assert "| teacher |" in table and "| start (step 0): random init |" in table and "| student (step 2) |" in table


@pytest.mark.parametrize(
  "family, message",
  [
    ((dict(name="a"), dict(name="a")), "two students are named 'a'"),
    ((), "family is empty: list at least one student"),
    (("",), "family is empty: list at least one student"),  # `--config.family=`
    (("s2",), "family entry 0 is 's2', not a student: give each as a dict"),
    ((dict(name="a/b"),), "family entry 0 is named 'a/b': a student's name has no '/'"),
    ((dict(name=" s2"),), "family entry 0 is named ' s2'"),
    ((dict(student=dict(num_layers=1)),), "family entry 0 has no name"),
    ((dict(name="a", loss=dict(num_relation_heads=3)),), "family student a: .*num_relation_heads=3 does not divide"),
    ((dict(name="a", teacher=dict(layer=7)),), "family student a: teacher.layer=7 but the model has 2 layers"),
    ((dict(name="a", data=dict(max_seq_length=16)),), "family student a: 'data' is the family's"),
    ((dict(name="a", teacher=dict(path="x")),), "family student a: teacher.path is no field a student sets alone"),
    ((dict(name="a", optimizer=dict(accumulate_steps=2)),), "optimizer.accumulate_steps is the family's"),
    ((dict(name="a", loss=dict(objective="mlm_kd")),), "masks the inputs the teacher reads"),
    ((dict(name="a", optimizer=dict(lr=-1.0)),), "family student a: optimizer.lr"),
  ],
)
def test_a_family_that_cannot_run_is_one_line_before_any_work(tiny_mlm_teacher, tiny_corpus, tmp_path, family, message):
  config = tiny_config(tiny_mlm_teacher, tiny_corpus)
  with config.unlocked():
    config.family = family
  with pytest.raises(UserError, match=message):
    build_distillation(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints")


@pytest.mark.slow
def test_the_train_program_distils_a_family_and_convert_names_a_student(tiny_teacher, tiny_corpus, tmp_path, capfd):
  """The `train` program with a family config, then `convert --to-hf --student` naming one
  of the family (it writes that student) and naming none of them: one line, exit 2, nothing written
  (naming no student: `export_run`'s refusal, in the test above and here in process)."""
  config = tmp_path / "family.py"
  config.write_text(
    "import sys\n"
    f"sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
    "from conftest import tiny_config\n"
    f"from test_family import STUDENTS\n\n\n"
    "def get_config():\n"
    f"  c = tiny_config({tiny_teacher!r}, {tiny_corpus!r}, num_steps=2)\n"
    "  c.family = STUDENTS[:2]\n"
    "  return c\n"
  )
  workdir = str(tmp_path / "family")
  proc = run_in_process("train", "--config", config, "--workdir", workdir, capfd=capfd)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert runs.read_record(workdir).students.keys() == {"2x16", "1x32"}
  convert = ["convert", "--to-hf", "--workdir", workdir, "--out"]
  proc = run_in_process(*convert, tmp_path / "x", "--student", "1x32", capfd=capfd)
  assert proc.returncode == 0 and "wrote 1x32 encoder" in proc.stderr, proc.stderr[-2000:]
  assert runs.load_encoder(str(tmp_path / "x")).config.hidden_size == 32
  proc = run_in_process(*convert, tmp_path / "y", "--student", "4x16", capfd=capfd)
  assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
  assert "--student 4x16" in proc.stderr and "2x16, 1x32" in proc.stderr
  with pytest.raises(UserError, match="holds a family of students.*--student"):
    runs.export_run(workdir, str(tmp_path / "y"))
  assert not os.path.exists(tmp_path / "y")


@pytest.mark.slow
def test_bench_distill_family_times_the_family_against_each_student_alone():
  """`bench distill --family` at a tiny size: one row per length, the family's tokens/s and its
  speed-up over the separate steps beside the ideal from the parts' FLOPs, computed here by hand;
  two students of one shape are two students."""
  from minilm_jax.benchmarks import distill
  from minilm_jax.models import flops

  settings = distill.Settings(teacher="2x64", students=["2x32", "2x32"], batch_size=4, seq_lens=[16])
  rows = distill.run(dataclasses.replace(settings, repeats=1, family=True))
  assert len(rows) == 1 and rows[0]["family"] == "2x32,2x32" and rows[0]["family_tokens_per_s"] > 0
  assert rows[0]["speedup"] > 0 and rows[0]["of_ideal"] == pytest.approx(rows[0]["speedup"] / rows[0]["ideal_speedup"])
  row = rows[0]  # the ideal the measured teacher pass gives: the separate steps less one of their two
  assert row["teacher_forward_ms"] > 0 and row["measured_ideal_speedup"] > 1
  assert row["of_measured_ideal"] == pytest.approx(row["speedup"] / row["measured_ideal_speedup"])
  teacher = flops.parse_shape("2x64")
  parts = [
    flops.distill_step_flops_by_part(flops.LossLayer(teacher, 1), flops.LossLayer(flops.parse_shape(s), n - 1), 4, 16)
    for s, n in (("2x32", 2), ("2x32", 2))
  ]
  t = parts[0]["teacher forward"]
  students = [sum(v for k, v in p.items() if k != "teacher forward") for p in parts]
  assert rows[0]["ideal_speedup"] == pytest.approx((2 * t + sum(students)) / (t + sum(students)))
  with pytest.raises(UserError, match="--family with --profile"):
    distill.run(dataclasses.replace(settings, family=True, profile_dir="x"))
  alone = "--family times a family against each student alone, and"
  with pytest.raises(UserError, match=f"{alone} --student 2x32 is one: give two or more"):
    distill.run(dataclasses.replace(settings, family=True, students=["2x32"]))
  with pytest.raises(UserError, match=f"{alone} --case cpu's 3x384 is one"):  # the case's own one student
    distill.run(distill.Settings(family=True))


@pytest.mark.slow
def test_a_lone_run_resumed_as_a_family_or_the_reverse_names_the_change(tiny_teacher, tiny_corpus, tmp_path):
  """A workdir's run resumes only as what it is: a lone run given a family config (and a family given
  a lone config) is told the `family` field changed, before anything is read or written."""
  lone, family = str(tmp_path / "lone"), str(tmp_path / "family")
  build_distillation(tiny_config(tiny_teacher, tiny_corpus, num_steps=1), lone).run()
  build_distillation(_family_config(tiny_teacher, tiny_corpus, STUDENTS[:1], num_steps=1), family).run()
  with pytest.raises(UserError, match=r"holds a run started with another config \(family: '\(none\)' ->"):
    build_distillation(_family_config(tiny_teacher, tiny_corpus, STUDENTS[:1], num_steps=2), lone)
  with pytest.raises(UserError, match=r"holds a run started with another config \(family: .* -> '\(none\)'"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, num_steps=2), family)
