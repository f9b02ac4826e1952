"""MiniLM distillation's run: it reads the teacher and the corpus, builds its student (or each
student of a family, `distill.family`) on the step of `distill.step`, and trains through
`training.loop` (`build_distillation`, `Distillation`).
"""

import dataclasses
import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
from jax.sharding import Mesh

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, split_heldout
from minilm_jax.data.languages import LanguageBlocks, corpus_first_sentences, language_list
from minilm_jax.data.prepared import corpus_blocks
from minilm_jax.devices import parallel
from minilm_jax.distill import config as distill_config
from minilm_jax.distill import etd
from minilm_jax.distill.step import DistillationStep, build_step, init_state, make_heldout_step, teacher_pooling
from minilm_jax.distill.untrained import untrained_student_parameters
from minilm_jax.errors import UserError
from minilm_jax.evaluation import evaluators
from minilm_jax.models.encoder import Encoder
from minilm_jax.runs import lock
from minilm_jax.runs.checkpoints import weights_digest
from minilm_jax.runs.record import DISTILLATION, RunRecord
from minilm_jax.training.loop import LoopHooks, begin_run, steps_of_epochs, train_loop
from minilm_jax.training.train_state import (
  TrainState,
  restore_or_init,
)
from minilm_jax.transfer.objectives import Objective


@dataclasses.dataclass(frozen=True)
class Distillation:
  """A distillation run's parts, built and validated by `build_distillation` before any compute;
  `run()` trains them with the common loop."""

  config: Any
  workdir: str
  mesh: Mesh
  tokenizer: Any
  parts: "Student"  # its step, the teacher as the step reads it, evaluators, untrained names, ETD start
  stream: BatchStream
  heldout: dict | None  # the corpus blocks training never reads (`heldout_record`)
  checkpoints: runs.RunCheckpoints
  teacher_weights: str  # the teacher's digest, kept in the record for resumes (`check_same_teacher`)

  @property
  def step(self) -> DistillationStep:
    return self.parts.step

  @property
  def evaluators(self) -> evaluators.Evaluators:
    return self.parts.evaluators

  @property
  def teacher(self) -> Encoder:
    return self.step.teacher

  @property
  def student(self) -> Encoder:
    return self.step.student

  @property
  def objective(self) -> Objective:
    return self.step.objective

  def initial_state(self):
    """The latest checkpoint's state and data position, or a fresh student at batch 0."""
    rng = jax.random.fold_in(jax.random.key(self.config.seed), 0)
    return restore_or_init(
      self.checkpoints,
      partial(init_state, self.student, self.step.tx, self.objective),
      (rng, self.parts.start_params),
      parallel.replicated(self.mesh),
    )

  @property
  def num_steps(self) -> int:
    return self.config.num_steps

  def record(self) -> RunRecord:
    record = student_record(self.config, self.step, self.parts.untrained, self.heldout)
    return dataclasses.replace(record, teacher_weights=self.teacher_weights)

  def run(self) -> TrainState:
    state, next_batch = self.initial_state()  # before writing: a restore that fails leaves the workdir as it was
    if jax.process_index() == 0:
      runs.save_tokenizer(self.workdir, self.tokenizer)
    dropout_rng = jax.random.fold_in(jax.random.key(self.config.seed), 1)

    def step_fn(state, batch):
      return self.step.train_step(state, batch, self.parts.teacher_params, dropout_rng)

    evaluate = (lambda step, state: self.evaluators(step, state.params)) if self.evaluators else None
    state = train_loop(self, state, next_batch, step_fn, LoopHooks("distill", evaluate=evaluate))
    print_summary(self.parts, self.workdir, state.params)
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
    table = evaluators.summary(student.config, workdir, speed, sizes, name)
    print("\n" + (f"{name}:\n" if name and table else "") + table, flush=True)


def student_record(config, step: DistillationStep, untrained: tuple, heldout: dict | None) -> RunRecord:
  """What a distilled student is: its encoder, its config, what its objective never trained, the
  blocks it never read and its sentence embeddings' pipeline."""
  return RunRecord(
    DISTILLATION,
    step.student.config,
    json.loads(config.to_json()),
    untrained=untrained,
    heldout=heldout,
    sentence_embedding={
      **step.objective.pooling.to_dict(),
      "dense": step.objective.projection_shapes().get("embedding"),
    },
  )


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
  (its architecture, weights, masked-LM head, sentence pipeline) and tokenizer, the masking ids;
  once `read_corpus` has read it, the corpus's batch stream, its held-out blocks and their collate
  function."""

  config: Any
  workdir: str
  mesh: Mesh
  teacher: Any  # hf.LoadedModel
  masking: tuple  # (special token ids, mask id)
  placed: dict  # the teacher's parameters replicated on the mesh, once for every student
  teacher_weights: str  # their digest, kept in the run's record (`check_same_teacher`)
  stream: BatchStream | None = None
  heldout: Any = None
  collate: Callable | None = None

  @property
  def tokenizer(self):
    return self.teacher.tokenizer

  def teacher_on_mesh(self, needs_mlm_head: bool) -> dict:
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
  masking = (tuple(teacher.tokenizer.all_special_ids), teacher.tokenizer.mask_token_id)
  mesh = mesh or parallel.make_mesh()
  weights = weights_digest(teacher.params)
  check_same_teacher(config.teacher.path, workdir, weights, resumed)
  placed = jax.device_put(teacher.params, parallel.replicated(mesh))
  return Shared(config, workdir, mesh, teacher, masking, placed, weights)


def check_same_teacher(teacher_path: str, workdir: str, weights: str, record: RunRecord | None):
  """A run resumes only from the teacher it started with: its `teacher.path` cannot change (the
  config check), but a model rebuilt or retrained at that path would teach the rest of the run
  something else (`record`: the resumed run's). Runs whose record predates the digest resume as
  before."""
  saved = None if record is None else record.teacher_weights
  if saved is not None and saved != weights:
    raise UserError(
      f"teacher.path={teacher_path} holds other weights than the teacher {workdir} started from "
      f"(digest {saved[:12]}, now {weights[:12]}): put that teacher back, or start a new --workdir"
    )


def read_corpus(shared: Shared, students: list) -> Shared:
  """`shared` with the corpus read: its batch stream and held-out blocks. With `data.epochs` the
  step count is known now, and set in the run's config and in each of `students`' configs."""
  config = shared.config
  blocks, collate = corpus_blocks(config.data, shared.tokenizer, os.path.join(shared.workdir, "data"))
  blocks, heldout = split_heldout(blocks, config.data.heldout_blocks, config.batch_size)
  process = (jax.process_index(), jax.process_count())
  stream = BatchStream(blocks, config.batch_size, config.seed, collate, *process, f"corpus {config.data.corpus}")
  if config.data.epochs:  # a schedule in passes over the corpus (ETD's): its length is known now
    for c in [config, *students]:
      c.num_steps = steps_of_epochs(config.data.epochs, stream.batches_per_epoch, "data.epochs")
  return dataclasses.replace(shared, stream=stream, heldout=heldout, collate=collate)


def check_settings(config):
  """What a student's config says that needs no teacher: its evaluators and its start."""
  evaluators.check_specs(config, evaluators.DISTILLATION_PROVIDES)
  if config.student.init not in ("random", "etd"):
    raise UserError(f"student.init={config.student.init!r}: use random or etd")


def check_student(shared: Shared, config) -> DistillationStep:
  """A student's settings checked against the teacher and the mesh before the corpus is read (a
  corpus of hours is not tokenised for a config that cannot run): its step, built."""
  teacher = shared.teacher
  step = build_step(
    config, teacher.config, shared.mesh, shared.masking, teacher_pooling(config, teacher.sentence_pipeline)
  )
  if step.objective.needs.mlm_head and teacher.mlm_head is None:
    raise UserError(
      f"loss.objective={config.loss.objective} needs the teacher's masked-LM head, and this teacher "
      f"has none: use a checkpoint saved with it (e.g. BertForMaskedLM) or another objective"
    )
  if config.student.init == "etd":  # the extraction's shape checks, before its corpus is read
    etd.check_extractable(teacher.config, step.student.config)
    etd.select_layers(teacher.config.num_layers, step.student.config.num_layers, config.etd.layers)
  return step


@dataclasses.dataclass(frozen=True)
class Student:
  """One student of a run: its step, the teacher's parameters as its step reads them, its
  evaluators, the parameters its objective never trains, and its ETD start."""

  config: Any
  step: DistillationStep
  teacher_params: dict
  evaluators: evaluators.Evaluators
  untrained: tuple
  start_params: dict | None  # ETD's extraction; None: random init, or a run that resumes


def build_student(shared: Shared, config, resumes: bool) -> Student:
  """A student of `shared`'s teacher as `config` (its own, or a family member's) says, every error
  its settings can cause raised here (`check_student`, again: the corpus may have set the step
  count); its ETD start only when the run does not resume."""
  teacher, mesh = shared.teacher, shared.mesh
  step = check_student(shared, config)
  step_teacher = shared.teacher_on_mesh(step.objective.needs.mlm_head)
  heldout_stream, heldout_step = _heldout_evaluation(shared.heldout, config, shared.collate, step, mesh)
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
  """Reads the teacher and the corpus, validates `config` against them and the mesh, and returns
  the run's parts (the step `build_step` gives, the batch stream, the evaluators, the checkpoints,
  the ETD start): every error a config can cause surfaces here, before any compute."""
  resumed = begin_run(config, workdir, distill_config.RANGES, distill_config.CONTRADICTIONS)
  check_settings(config)
  shared = read_teacher(config, workdir, mesh, resumed)
  check_student(shared, config)
  shared = read_corpus(shared, [])
  assert shared.stream is not None  # read_corpus reads it
  checkpoints = runs.RunCheckpoints(
    workdir, config.checkpoint.every, config.checkpoint.keep, best=evaluators.best_direction(config)
  )
  student = build_student(shared, config, resumes=checkpoints.latest_step() is not None)
  return Distillation(
    config,
    workdir,
    shared.mesh,
    shared.tokenizer,
    student,
    shared.stream,
    heldout_record(shared.heldout),
    checkpoints,
    shared.teacher_weights,
  )


def _heldout_evaluation(heldout, config, collate, step, mesh) -> tuple:
  """(batch stream, jitted loss step) of the corpus's held-out blocks for the `heldout` evaluator,
  (None, None) without them: every process reads its part, in the same order every evaluation, in
  batches of the run's `batch_size`."""
  if heldout is None:
    return None, None
  batch_size, seed = config.batch_size, config.seed
  process = (jax.process_index(), jax.process_count())
  stream = BatchStream(heldout, batch_size, seed, collate, *process, "held-out blocks")
  return stream, make_heldout_step(step.teacher, step.student, step.objective, mesh, seed)


def parameter_count(params) -> int:
  """The encoder's parameters: what the objective learns besides (maps, masked-LM heads) left out."""
  encoder = {k: v for k, v in params.items() if k not in ("projection", "mlm_head")}
  return sum(int(x.size) for x in jax.tree.leaves(encoder))
