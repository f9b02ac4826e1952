"""A family of students distilled from one teacher in one run (`config.family`): the teacher's
forward pass, three quarters of a BERT-base -> 6x384 step, is computed once a batch for all of them.

A family config is a distillation config with a `family` field, a tuple of entries, one a student:
`dict(name="6x384", student=dict(num_layers=6), optimizer=dict(lr=3e-4))`. An entry overrides what
only a student reads (its `student`, `loss`, `etd` and `optimizer` fields, and `teacher.layer`, the
teacher layer it learns); the teacher, the corpus and its batch order, the batch size, the steps,
the dtype, the seed, the evaluators and the checkpoints are the family's. Each student is built as
the student of its own config would be (`trainer.build_student`) and trained by the family's step
(`step.make_family_step`) as it would be alone: the same parameters after the same steps, from
the same seed and batches. This module is the one place that knows there are several.

One run record and one checkpoint hold every student (the state's `params` and `opt_state` keyed by
name; the record's `students`, each student's own record); metrics and evaluations are logged under
each student's name (`6x384/loss`, `6x384/eval/...`); `python -m minilm_jax.convert --to-hf --student
6x384` exports one.
"""

import copy
import dataclasses
import json
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream
from minilm_jax.devices import parallel
from minilm_jax.distill import config as distill_config
from minilm_jax.distill.step import Learner, init_state, keyed_state, make_family_step
from minilm_jax.distill.trainer import (
  Shared,
  Student,
  build_student,
  check_settings,
  check_student,
  heldout_record,
  print_summary,
  read_corpus,
  read_teacher,
  student_record,
)
from minilm_jax.errors import UserError
from minilm_jax.runs import lock
from minilm_jax.runs.record import DISTILLATION, RunRecord
from minilm_jax.training.loop import LoopHooks, begin_run, check_ranges, train_loop
from minilm_jax.training.train_state import TrainState, restore_or_init

# What an entry may set: the blocks only a student reads, and of the teacher's block the layer it learns.
STUDENT_BLOCKS = ("student", "loss", "etd", "optimizer")
TEACHER_FIELDS = ("layer",)
# Of the optimizer block, what the family's one batch split fixes for every student.
FAMILY_OPTIMIZER_FIELDS = ("accumulate_steps",)


def is_family(config) -> bool:
  return bool(config.get("family"))


def member_configs(config) -> dict:
  """{name: that student's whole distillation config}: the family's, with the entry's overrides;
  one line for an entry that is not a student's, a name given twice, a field no config has, or one
  that is the family's."""
  members = {}
  for i, given in enumerate(config.family):
    entry = dict(given) if isinstance(given, dict | ml_collections.ConfigDict) else {}
    name = entry.get("name")
    if not isinstance(name, str) or not name or "/" in name or name != name.strip():
      raise UserError(
        f"family entry {i} has no name: give each student a name without '/' or spaces at its ends, "
        f'e.g. dict(name="6x384", student=dict(num_layers=6))'
      )
    if name in members:
      raise UserError(f"family: two students are named {name!r}: give each its own name")
    c = copy.deepcopy(config)
    with c.unlocked():
      del c["family"]
    for block, fields in entry.items():
      if block != "name":
        _override(c, name, block, fields)
    members[name] = c
  if not members:
    raise UserError("family is empty: list at least one student, or leave the field out for one student")
  return members


def _override(c, name: str, block: str, fields):
  """`c[block][field] = value` for an entry's block, refusing what a student may not set alone."""
  allowed = TEACHER_FIELDS if block == "teacher" else None
  if block not in STUDENT_BLOCKS and block != "teacher":
    raise UserError(
      f"family student {name}: {block!r} is the family's (one teacher, corpus, batch order and schedule): "
      f"a student sets {', '.join(STUDENT_BLOCKS)} and teacher.layer"
    )
  if not isinstance(fields, dict | ml_collections.ConfigDict):
    raise UserError(f"family student {name}: {block} must be a dict of its fields, e.g. {block}=dict(...)")
  for field, value in dict(fields).items():
    if field not in c[block] or (allowed is not None and field not in allowed):
      raise UserError(f"family student {name}: {block}.{field} is no field a student sets alone")
    if block == "optimizer" and field in FAMILY_OPTIMIZER_FIELDS:
      raise UserError(f"family student {name}: optimizer.{field} is the family's: set it once, outside `family`")
    c[block][field] = value


def fresh_state(steps: dict, rng, starts: dict) -> TrainState:
  """The family's train state at step 0: each student's (`steps`: name -> `DistillationStep`) fresh
  state as it would start alone (`step.init_state`, from `rng` and its ETD start, or random),
  their parameters and optimizer states keyed by name."""
  return keyed_state({n: init_state(s.student, s.tx, s.objective, rng, starts.get(n)) for n, s in steps.items()})


def _as_student(name: str, fn, *args):
  """`fn(*args)`, its one-line error said of the family's student `name`."""
  try:
    return fn(*args)
  except UserError as e:
    raise UserError(f"family student {name}: {e}") from None


@dataclasses.dataclass(frozen=True)
class Family:
  """A family run's parts, built and validated by `build_family` before any compute; `run()`
  trains every student with the common loop."""

  config: Any
  workdir: str
  mesh: Mesh
  shared: Shared
  students: dict  # name -> trainer.Student
  train_step: Any  # jitted (state, batch, teacher_params, rng) -> (state, metrics)
  checkpoints: runs.RunCheckpoints

  @property
  def stream(self) -> BatchStream:
    assert self.shared.stream is not None  # read_corpus read it
    return self.shared.stream

  @property
  def num_steps(self) -> int:
    return self.config.num_steps

  def record(self) -> RunRecord:
    heldout = heldout_record(self.shared.heldout)
    students = {n: student_record(s.config, s.step, s.untrained, heldout).to_json() for n, s in self.students.items()}
    config = json.loads(self.config.to_json())
    return RunRecord(
      DISTILLATION, None, config, heldout=heldout, students=students, teacher_weights=self.shared.teacher_weights
    )

  def initial_state(self):
    """The latest checkpoint's state and data position, or every student fresh at batch 0 (each
    from the rng it would start from alone)."""
    rng = jax.random.fold_in(jax.random.key(self.config.seed), 0)
    starts = {n: s.start_params for n, s in self.students.items()}
    return restore_or_init(self.checkpoints, self._fresh, (rng, starts), parallel.replicated(self.mesh))

  def _fresh(self, rng, starts: dict) -> TrainState:
    return fresh_state({n: s.step for n, s in self.students.items()}, rng, starts)

  def evaluate(self, step: int, state) -> dict:
    """Every student's evaluators due at `step`, under its name."""
    return {
      f"{n}/{k}": v
      for n, s in self.students.items()
      if s.evaluators
      for k, v in s.evaluators(step, state.params[n]).items()
    }

  def run(self) -> TrainState:
    state, next_batch = self.initial_state()  # before writing: a restore that fails leaves the workdir as it was
    if jax.process_index() == 0:
      runs.save_tokenizer(self.workdir, self.shared.tokenizer)
    dropout_rng = jax.random.fold_in(jax.random.key(self.config.seed), 1)
    teacher_params = self.shared.placed

    def step_fn(state, batch):
      return self.train_step(state, batch, teacher_params, dropout_rng)

    evaluate = self.evaluate if any(s.evaluators for s in self.students.values()) else None
    hooks = LoopHooks(f"distill {','.join(self.students)}", evaluate=evaluate)
    state = train_loop(self, state, next_batch, step_fn, hooks)
    for name, s in self.students.items():
      print_summary(s, self.workdir, state.params[name], name)
    lock.release(self.workdir)  # its last write done: the workdir is free for the next program
    return state


@lock.released_on_error
def build_family(config, workdir: str, mesh=None) -> Family:
  """Reads the teacher and the corpus once, builds and validates every student of `config.family`
  against them and the mesh (each error said of its student), and returns the run's parts."""
  resumed = begin_run(config, workdir, distill_config.RANGES, distill_config.CONTRADICTIONS)
  if config.checkpoint.best:
    raise UserError(
      f"checkpoint.best={config.checkpoint.best} picks one step for one student: a family keeps its "
      "latest checkpoints (leave checkpoint.best empty, or distil that student alone)"
    )
  members = member_configs(config)
  for name, c in members.items():
    _as_student(name, check_ranges, c, distill_config.RANGES)
    _as_student(name, check_settings, c)
  shared = read_teacher(config, workdir, mesh, resumed)
  for name, c in members.items():
    step = _as_student(name, check_student, shared, c)
    if step.objective.needs.mlm_head:
      raise UserError(
        f"family student {name}: loss.objective={c.loss.objective} masks the inputs the teacher reads, "
        "which the family's students share: distil it alone"
      )
  shared = read_corpus(shared, list(members.values()))
  checkpoints = runs.RunCheckpoints(workdir, config.checkpoint.every, config.checkpoint.keep)
  resumes = checkpoints.latest_step() is not None
  students: dict[str, Student] = {n: _as_student(n, build_student, shared, c, resumes) for n, c in members.items()}
  learners = {n: Learner(s.step.student, s.step.objective, s.step.tx, s.step.schedule) for n, s in students.items()}
  teacher = next(iter(students.values())).step.teacher
  train_step = make_family_step(teacher, learners, shared.mesh, config.optimizer.accumulate_steps)
  return Family(config, workdir, shared.mesh, shared, students, train_step, checkpoints)
