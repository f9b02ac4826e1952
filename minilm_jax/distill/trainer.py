"""MiniLM distillation's run: it reads the teacher and the corpus, builds its students (one, or a
family from one teacher pass: `distill.family`) on the one step of `distill.step`, and trains them
through `training.loop` (`build_distillation`, `Distillation`).
"""

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, split_heldout
from minilm_jax.data.languages import LanguageBlocks, corpus_first_sentences, language_list
from minilm_jax.data.prepared import corpus_blocks
from minilm_jax.devices import parallel
from minilm_jax.distill import config as distill_config
from minilm_jax.distill import etd, family
from minilm_jax.distill.family import LONE, said_of
from minilm_jax.distill.step import DistillationStep, TrainStep, build_train_step, teacher_pooling
from minilm_jax.distill.untrained import untrained_student_parameters
from minilm_jax.errors import UserError
from minilm_jax.evaluation import evaluators
from minilm_jax.runs import lock
from minilm_jax.runs.checkpoints import weights_digest
from minilm_jax.runs.record import DISTILLATION, RunRecord, check_same_inputs, check_same_teacher
from minilm_jax.training.loop import LoopHooks, begin_run, check_fields, steps_of_epochs, train_loop
from minilm_jax.training.train_state import TrainState, restore_or_init
from minilm_jax.transfer.objectives import Masking


@dataclasses.dataclass(frozen=True)
class Distillation:
  """A distillation run's parts, built and validated by `build_distillation` before any compute:
  its students (name -> `Student`; a lone run's one under `LONE`), what they share (`Shared`), the
  one step that trains them; `run()` trains them with the common loop."""

  config: Any
  workdir: str
  shared: "Shared"
  students: dict  # name -> Student
  train_step: TrainStep
  checkpoints: runs.RunCheckpoints

  @property
  def mesh(self) -> Mesh:
    return self.shared.mesh

  @property
  def stream(self) -> BatchStream:
    assert self.shared.stream is not None  # read_corpus read it
    return self.shared.stream

  @property
  def num_steps(self) -> int:
    return self.config.num_steps

  @property
  def lone(self) -> "Student":
    """The one student of a lone run."""
    return self.students[LONE]

  def record(self) -> RunRecord:
    """A lone run's record is its student's; a family's holds each student's under its name."""
    heldout = heldout_record(self.shared.heldout)
    weights, inputs = self.shared.teacher_weights, self.shared.inputs
    if not self.train_step.keyed:
      return dataclasses.replace(self.lone.record(heldout), teacher_weights=weights, inputs=inputs)
    students = {n: s.record(heldout).to_json() for n, s in self.students.items()}
    config = json.loads(self.config.to_json())
    return RunRecord(
      DISTILLATION, None, config, heldout=heldout, students=students, teacher_weights=weights, inputs=inputs
    )

  def initial_state(self):
    """The latest checkpoint's state and data position, or every student fresh at batch 0 (each
    from the rng it would start from alone, and its ETD start)."""
    rng = jax.random.fold_in(jax.random.key(self.config.seed), 0)
    starts = {n: s.start_params for n, s in self.students.items()}
    return restore_or_init(self.checkpoints, self.train_step.init, (rng, starts))

  def evaluate(self, step: int, state) -> dict:
    """Every student's evaluators due at `step`, a family's under each student's name."""
    out = {}
    for name, s in self.students.items():
      if s.evaluators:
        scores = s.evaluators(step, self.train_step.params_of(state, name))
        out.update({f"{name}/{k}" if name else k: v for k, v in scores.items()})
    return out

  def run(self) -> TrainState:
    state, next_batch = self.initial_state()  # before writing: a restore that fails leaves the workdir as it was
    if jax.process_index() == 0:
      runs.save_tokenizer(self.workdir, self.shared.tokenizer)
    dropout_rng = jax.random.fold_in(jax.random.key(self.config.seed), 1)
    teacher_params = self.shared.on_mesh(any(s.step.objective.needs.mlm_head for s in self.students.values()))

    schedules = self.train_step.schedules

    def step_fn(state, batch):
      return self.train_step.jitted(state, batch, teacher_params, dropout_rng, schedules)

    evaluate = self.evaluate if any(s.evaluators for s in self.students.values()) else None
    caption = f"distill {','.join(self.students)}" if self.train_step.keyed else "distill"
    state = train_loop(self, state, next_batch, step_fn, LoopHooks(caption, evaluate=evaluate))
    for name, s in self.students.items():
      print_summary(s, self.workdir, self.train_step.params_of(state, name), name)
    lock.release(self.workdir)  # its last write done: the workdir is free for the next program
    return state


def print_summary(student: "Student", workdir: str, params, name: str = "") -> None:
  """The run's evaluations of `student` (trained to `params`) as one table below the progress bars
  (`evaluators.summary`), with the teacher's and the student's sizes and speeds; for a family's
  student `name`, its own rows under its name. Nothing without evaluators."""
  if not student.evaluators:
    return
  speed = student.evaluators.speed(params)  # on every process: the encoders run on the whole mesh
  if jax.process_index() == 0:  # the one that wrote metrics.jsonl
    sizes = {"teacher": parameter_count(student.teacher_params), "student": parameter_count(params)}
    table = evaluators.summary(student.config, metric_rows(workdir, name), speed, sizes)
    print("\n" + (f"{name}:\n" if name and table else "") + table, flush=True)


def metric_rows(workdir: str, name: str) -> list:
  """The rows of the run's metrics.jsonl; for a family's student `name`, its metrics alone, named as a
  lone run's (`<name>/eval/...` as `eval/...`)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if name == LONE:
    return rows
  prefix = f"{name}/"
  return [{"step": r["step"], **{k[len(prefix) :]: v for k, v in r.items() if k.startswith(prefix)}} for r in rows]


def heldout_record(heldout) -> dict | None:
  """The run record's account of the blocks training never reads: their count, and where they are
  in the corpus (the first of them; in several languages, each language's row ranges)."""
  if heldout is None:
    return None
  if isinstance(heldout, LanguageBlocks):
    return {
      "blocks": len(heldout),
      "spans": {code: [list(r) for r in ranges] for code, ranges in heldout.spans.items()},
    }
  return {"blocks": len(heldout), "first_block": heldout.start}


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every student of a run shares, read once: the run's config, workdir and mesh, the teacher
  (its architecture, weights, masked-LM head, sentence pipeline) and tokenizer, the masking ids, the
  teacher's side of the evaluations (scored once for all students); once `read_corpus` has read
  it, the corpus's batch stream, its held-out blocks and their collate function."""

  config: Any
  workdir: str
  mesh: Mesh
  teacher: Any  # hf.LoadedModel
  masking: Masking  # the tokenizer's special ids and [MASK]
  placed: dict  # the teacher's parameters replicated on the mesh, once for every student
  teacher_weights: str  # their digest, kept in the run's record (`check_same_teacher`)
  teacher_scores: evaluators.TeacherScores
  stream: BatchStream | None = None
  heldout: Any = None
  collate: Callable | None = None
  inputs: dict = dataclasses.field(default_factory=dict)  # the corpus's identity (`RunRecord.inputs`)

  @property
  def tokenizer(self):
    return self.teacher.tokenizer

  def on_mesh(self, needs_mlm_head: bool) -> dict:
    """The teacher's parameters as the step reads them, replicated on the mesh."""
    if not needs_mlm_head:
      return self.placed
    return {**self.placed, "mlm_head": jax.device_put(self.teacher.mlm_head, parallel.replicated(self.mesh))}


def read_teacher(config, workdir: str, mesh, resumed: RunRecord | None) -> Shared:
  """The teacher of a run (`begin_run` checked it and read `resumed`, the record of the run it
  resumes), checked against `config` (what every student shares: its `data` block)."""
  language_list(config.data)
  # The masked-LM head (soft labels, ETD-Impt) comes from the same read of the teacher's weights.
  # A teacher that is a run gives its sentence pipeline from the same opening of its checkpoints.
  teacher = runs.load_encoder(config.teacher.path, config.dtype, "teacher.path", mlm_head=True, sentence_pipeline=True)
  evaluators.check_lengths(config, teacher.config.max_position_embeddings)
  masking = Masking.of(teacher.tokenizer)
  mesh = mesh or parallel.make_mesh(config.mesh.data, 1)
  weights = weights_digest(teacher.params)
  check_same_teacher(f"teacher.path={config.teacher.path}", workdir, weights, resumed)
  placed = jax.device_put(teacher.params, parallel.replicated(mesh))
  return Shared(config, workdir, mesh, teacher, masking, placed, weights, evaluators.TeacherScores())


def read_corpus(shared: Shared, members: list, resumed: RunRecord | None) -> Shared:
  """`shared` with the corpus read: its batch stream and held-out blocks, the corpus checked against
  what the run it resumes (`resumed`) read. With `data.epochs` the step count is known now,
  and set in the run's config and in each of its students' (`members`)."""
  config = shared.config
  blocks, collate, read = corpus_blocks(config.data, shared.tokenizer, os.path.join(shared.workdir, "data"))
  check_same_inputs(shared.workdir, read, resumed)
  inputs = {field: digest for field, (_, digest) in read.items()}
  blocks, heldout = split_heldout(blocks, config.data.heldout_blocks, config.batch_size)
  process = (jax.process_index(), jax.process_count())
  stream = BatchStream(blocks, config.batch_size, config.seed, collate, *process, f"corpus {config.data.corpus}")
  if config.data.epochs:  # a schedule in passes over the corpus (ETD's): its length is known now
    for c in [config, *members]:
      c.num_steps = steps_of_epochs(config.data.epochs, stream.batches_per_epoch, "data.epochs")
  return dataclasses.replace(shared, stream=stream, heldout=heldout, collate=collate, inputs=inputs)


def check_settings(config):
  """What a student's config says that needs no teacher: its ranges, its evaluators and its start."""
  check_fields(config, distill_config.RANGES)
  evaluators.check_specs(config, evaluators.DISTILLATION_PROVIDES)
  if config.student.init not in ("random", "etd"):
    raise UserError(f"student.init={config.student.init!r}: use random or etd")


def step_of(shared: Shared, members: dict) -> TrainStep:
  """The run's step, its students' settings (`members`: name -> config) checked against the teacher
  and the mesh: built before the corpus is read (a corpus of hours is not tokenised for a config
  that cannot run), and again after (the corpus may set the step count)."""
  teacher = shared.teacher
  poolings = {n: teacher_pooling(c, teacher.sentence_pipeline) for n, c in members.items()}
  train_step = build_train_step(members, teacher.config, shared.mesh, shared.masking, poolings)
  for name, step in train_step.students.items():
    if step.objective.needs.mlm_head and teacher.mlm_head is None:
      said_of(name, _no_mlm_head, members[name])
  return train_step


def _no_mlm_head(config):
  raise UserError(
    f"loss.objective={config.loss.objective} needs the teacher's masked-LM head, and this teacher "
    f"has none: use a checkpoint saved with it (e.g. BertForMaskedLM) or another objective"
  )


@dataclasses.dataclass(frozen=True)
class Student:
  """One student of a run: its config, its part of the step, the teacher's parameters as its step
  reads them, its evaluators, the parameters its objective never trains, and its ETD start."""

  config: Any
  step: DistillationStep
  teacher_params: dict
  evaluators: evaluators.Evaluators
  untrained: tuple
  start_params: dict | None  # ETD's extraction; None: random init, or a run that resumes

  def record(self, heldout: dict | None) -> RunRecord:
    """What the distilled student is: its encoder, its config, what its objective never trained,
    the blocks it never read (`heldout_record`'s) and its sentence embeddings' pipeline."""
    return RunRecord(
      DISTILLATION,
      self.step.student.config,
      json.loads(self.config.to_json()),
      untrained=self.untrained,
      heldout=heldout,
      sentence_embedding={
        **self.step.objective.pooling.to_dict(),
        "dense": self.step.objective.projection_shapes().get("embedding"),
      },
    )


def build_student(shared: Shared, config, step: DistillationStep, heldout_step, resumes: bool) -> Student:
  """A student of `shared`'s teacher as `config` (its own, or a family member's) says, on its part
  `step` of the run's step; its ETD start only when the run does not resume."""
  teacher, mesh = shared.teacher, shared.mesh
  step_teacher = shared.on_mesh(step.objective.needs.mlm_head)
  heldout_stream, heldout_step = _heldout_evaluation(shared, heldout_step, config.batch_size, config.seed)
  context = evaluators.Context(
    mesh,
    shared.tokenizer,
    step.student,
    step.objective.pooling,
    config.data.max_seq_length,
    config.eval_batch_size,
    config.num_steps,
    teacher=step.teacher,
    teacher_params=step_teacher,
    teacher_pipeline=teacher.sentence_pipeline,
    teacher_path=config.teacher.path,
    teacher_scores=shared.teacher_scores,
    heldout_stream=heldout_stream,
    heldout_step=heldout_step,
  )
  # Parameters this objective leaves as initialised: traced, not computed.
  untrained = untrained_student_parameters(
    step.teacher, step.student, step.objective, step_teacher, step.abstract_state().params
  )
  start = None
  if config.student.init == "etd" and not resumes:
    start = etd.initial_student_params(
      config.etd,
      teacher.config,
      jax.device_get(teacher.params),
      teacher.mlm_head,
      step.student.config,
      lambda n: corpus_first_sentences(config.data, os.path.join(shared.workdir, "data"), n),
      shared.tokenizer,
      config.data.max_seq_length,
    )
  return Student(config, step, step_teacher, evaluators.Evaluators(config, context), tuple(untrained), start)


@lock.released_on_error
def build_distillation(config, workdir: str, mesh=None) -> Distillation:
  """Reads the teacher and the corpus once, validates the run's students (one, or a family:
  `family.members`) against them and the mesh, and returns the run's parts (its one step, the batch
  stream, the evaluators, the checkpoints, the ETD starts): every error a config can cause surfaces
  here, before any compute, a family's said of its student."""
  resumed = begin_run(config, workdir, distill_config.RANGES, distill_config.CONTRADICTIONS)
  members = family.members(config)
  for name, c in members.items():
    said_of(name, check_settings, c)
  shared = read_teacher(config, workdir, mesh, resumed)
  step_of(shared, members)
  shared = read_corpus(shared, list(members.values()), resumed)
  checkpoints = runs.RunCheckpoints(
    workdir, config.checkpoint.every, config.checkpoint.keep, best=evaluators.best_direction(config)
  )
  train_step = step_of(shared, members)
  resumes = checkpoints.latest_step() is not None
  students = {
    n: said_of(n, build_student, shared, c, train_step.students[n], train_step.heldout[n], resumes)
    for n, c in members.items()
  }
  return Distillation(config, workdir, shared, students, train_step, checkpoints)


def _heldout_evaluation(shared: Shared, heldout_step, batch_size: int, seed: int) -> tuple:
  """(batch stream, loss step) of the corpus's held-out blocks for the `heldout` evaluator (the
  student's `make_heldout_step` at the run's `seed`), (None, None) without them: every process reads
  its part, in the same order every evaluation, in batches of the run's `batch_size`."""
  if shared.heldout is None:
    return None, None
  process = (jax.process_index(), jax.process_count())
  stream = BatchStream(shared.heldout, batch_size, seed, shared.collate, *process, "held-out blocks")
  seed32 = np.int32(seed)  # an argument of the reused step, of one dtype whatever the config holds
  return stream, lambda params, batch, teacher_params: heldout_step(params, batch, teacher_params, seed32)


def parameter_count(params) -> int:
  """The encoder's parameters: what the objective learns besides (maps, masked-LM heads) left out."""
  encoder = {k: v for k, v in params.items() if k not in ("projection", "mlm_head")}
  return sum(int(x.size) for x in jax.tree.leaves(encoder))
