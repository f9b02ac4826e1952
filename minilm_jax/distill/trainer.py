"""MiniLM distillation: the data-parallel train step, and the run that reads the teacher and the
corpus and trains through `training.loop` (`build_distillation`, `Distillation`).

The step is written per device and mapped over the mesh axis `data` with `jax.shard_map` (pmap
semantics): each device runs teacher and student on its shard of the batch, gradients are
averaged with an explicit `pmean`, and every device applies the same update to its replica.
The teacher is an argument of the step, not part of the train state: no optimizer state, never
checkpointed, never donated.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, split_heldout
from minilm_jax.data.languages import LanguageBlocks, corpus_first_sentences, language_list
from minilm_jax.data.prepared import corpus_blocks
from minilm_jax.devices import parallel
from minilm_jax.distill import config as distill_config
from minilm_jax.distill import etd
from minilm_jax.distill.untrained import untrained_student_parameters
from minilm_jax.errors import UserError
from minilm_jax.evaluation import evaluators
from minilm_jax.models import embeddings
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.runs import lock
from minilm_jax.runs.record import DISTILLATION, RunRecord
from minilm_jax.training.loop import LoopHooks, begin_run, steps_of_epochs, train_loop
from minilm_jax.training.train_state import (
  TrainState,
  accumulated_value_and_grad,
  check_accumulation,
  guarded_update,
  make_optimizer,
  restore_or_init,
)
from minilm_jax.transfer import relations
from minilm_jax.transfer.objectives import Objective, make_objective, uses_embedding_term


def student_config(config, teacher: EncoderConfig | None = None) -> EncoderConfig:
  """The student's encoder: its own depth and width, the teacher's vocabulary and embeddings layout.
  Without a teacher (shape checks of configs), defaults of the student's model type stand in."""
  s = config.student
  base = teacher or EncoderConfig(model_type=s.model_type, vocab_size=s.vocab_size)
  if base.model_type != s.model_type or base.vocab_size != s.vocab_size:
    raise UserError(
      f"student is {s.model_type} with vocab {s.vocab_size} but the teacher is {base.model_type} with "
      f"vocab {base.vocab_size}: set student.model_type/vocab_size to the teacher's"
    )
  return base.replace(
    num_layers=s.num_layers,
    hidden_size=s.hidden_size,
    num_heads=s.num_heads,
    intermediate_size=s.intermediate_size,
    hidden_dropout=s.dropout,
    attention_dropout=s.dropout,
    dtype=config.dtype,
  )


def resolve_layer(index: int, num_layers: int, what: str) -> int:
  if not -num_layers <= index < num_layers:
    raise UserError(f"{what}={index} but the model has {num_layers} layers: use 0..{num_layers - 1} or -1 for the last")
  return index % num_layers


def init_state(student: Encoder, tx, objective, rng, params=None) -> TrainState:
  """A fresh train state: the given student parameters (ETD), or random ones, plus what the objective
  learns besides (`Objective.init_learned`: maps to the teacher's width, a masked-LM head)."""
  params = init_params(student.config, rng) if params is None else params
  return TrainState.fresh({**params, **objective.init_learned(rng, student.config)}, tx)


@dataclasses.dataclass(frozen=True)
class Learner:
  """One student of a train step: its encoder, the objective it learns by, its optimizer."""

  student: Encoder
  objective: Objective
  tx: optax.GradientTransformation
  schedule: Callable


def make_train_step(teacher: Encoder, student: Encoder, tx, schedule, objective, mesh, accumulate_steps: int = 1):
  """`train_step(state, batch, teacher_params, rng) -> (state, metrics)`, jitted with the state donated.
  `teacher_params` are the encoder's, with its masked-LM head under "mlm_head" when the objective
  runs it. With `accumulate_steps` K each device's batch runs as K micro-batches (teacher included)
  whose gradients are averaged before the one update. `metrics["skipped"]` is 1 where a non-finite
  loss or update was not applied (`guarded_update`)."""
  return _train_step(teacher, {"": Learner(student, objective, tx, schedule)}, mesh, accumulate_steps, family=False)


def make_family_step(teacher: Encoder, learners: dict, mesh, accumulate_steps: int = 1):
  """The train step of several students (`learners`, by name) of one teacher: the teacher runs once
  a batch, as deep as the deepest layer any student reads, and each student takes its own loss,
  gradient and update from it (`make_train_step`'s, student by student). The state is one
  `TrainState` whose `params` and `opt_state` are keyed by student; the metrics are each student's
  under its name (`<name>/loss`, ...), with `loss` their sum, `lr` the first's and `skipped` any."""
  return _train_step(teacher, learners, mesh, accumulate_steps, family=True)


def _member_states(state: TrainState, names, family: bool) -> dict:
  if not family:
    return {"": state}
  return {n: TrainState(state.step, state.params[n], state.opt_state[n]) for n in names}


def _joined(states: dict, metrics: dict, family: bool) -> tuple:
  """The step's (state, metrics) from each student's: as they are for one student, keyed by name
  for a family."""
  if not family:
    return states[""], metrics[""]
  first = next(iter(states.values()))
  state = TrainState(first.step, {n: s.params for n, s in states.items()}, {n: s.opt_state for n, s in states.items()})
  flat = {f"{n}/{k}": v for n, m in metrics.items() for k, v in m.items()}
  rows = list(metrics.values())
  total = {
    "loss": sum(m["loss"] for m in rows),
    "lr": rows[0]["lr"],
    "skipped": jnp.max(jnp.stack([m["skipped"] for m in rows])),
  }
  return state, {**total, **flat}


def _train_step(teacher: Encoder, learners: dict, mesh, accumulate_steps: int, family: bool):
  # Every student reads the same inputs (a family has no masking objective: `family.build_family`),
  # so the teacher's pass over them is shared; each student reads the layers its objective needs.
  first = next(iter(learners.values())).objective
  depth = max(learner.objective.teacher_layers_needed for learner in learners.values())

  def per_device(state, batch, teacher_params, rng):
    states = _member_states(state, learners, family)
    step_rng = jax.random.fold_in(jax.random.fold_in(rng, state.step), jax.lax.axis_index(parallel.DATA))

    def value_and_grad(params, micro_batch, index):
      micro_rng = step_rng if accumulate_steps == 1 else jax.random.fold_in(step_rng, index)
      dropout_rng, inputs_rng = jax.random.split(micro_rng)
      inputs = first.inputs(inputs_rng, micro_batch, teacher.config.vocab_size)
      # The teacher runs only up to the deepest layer the loss reads, deterministically. The named
      # scopes (here and the optimizer's) put the step's parts apart in a profile (`bench distill --profile`).
      with jax.named_scope("teacher"):
        teacher_out = first.outputs(teacher, teacher_params, inputs, depth)

      def loss_fn(params):
        terms = {
          name: learner.objective.student_terms(
            learner.student,
            params[name],
            teacher_out._replace(layers=teacher_out.layers[: learner.objective.teacher_layers_needed]),
            inputs,
            {"dropout": dropout_rng},
          )
          for name, learner in learners.items()
        }
        losses = {name: sum(t.values()) for name, t in terms.items()}
        return sum(losses.values()), (losses, terms)

      return jax.value_and_grad(loss_fn, has_aux=True)(params)

    # Cast the replicated parameters to device-varying: their gradient is then this device's own,
    # and the pmean below is the one and only reduction (without the cast, JAX >= 0.7 already sums
    # the gradient over devices and a pmean on top would scale it by the device count).
    params = jax.lax.pcast({name: s.params for name, s in states.items()}, parallel.DATA, to="varying")
    (_, (losses, terms)), grads = accumulated_value_and_grad(value_and_grad, params, batch, accumulate_steps)
    grads = jax.lax.pmean(grads, parallel.DATA)
    new_states, metrics = {}, {}
    for name, learner in learners.items():
      own = jax.lax.pmean({"loss": losses[name], **{f"loss_{k}": v for k, v in terms[name].items()}}, parallel.DATA)
      with jax.named_scope("optimizer"):
        new_states[name], skipped = guarded_update(states[name], grads[name], own["loss"], learner.tx)
      lr = learner.schedule(states[name].step)
      metrics[name] = {**own, "grad_norm": optax.tree.norm(grads[name]), "lr": lr, "skipped": skipped}
    return _joined(new_states, metrics, family)

  step = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(parallel.DATA), P(), P()), out_specs=(P(), P()))
  return jax.jit(step, donate_argnums=0)


def make_heldout_step(teacher: Encoder, student: Encoder, objective, mesh, seed: int):
  """`heldout_step(params, batch, teacher_params) -> {"loss", "loss_<term>"...}`: the train step's loss
  terms, deterministic (no dropout; the masking objectives' masks from `seed`), averaged over the mesh."""

  def per_device(params, batch, teacher_params):
    rng = jax.random.fold_in(jax.random.key(seed), jax.lax.axis_index(parallel.DATA))
    inputs = objective.inputs(rng, batch, teacher.config.vocab_size)
    teacher_out = objective.outputs(teacher, teacher_params, inputs, objective.teacher_layers_needed)
    terms = objective.student_terms(student, params, teacher_out, inputs)
    return jax.lax.pmean({"loss": sum(terms.values()), **{f"loss_{k}": v for k, v in terms.items()}}, parallel.DATA)

  step = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(parallel.DATA), P()), out_specs=P())
  return jax.jit(step)


@dataclasses.dataclass(frozen=True)
class DistillationStep:
  """The models, objective, optimizer and jitted step of a distillation config on a mesh: what the
  `train` program runs, and what `minilm_jax.aot` compiles from shapes alone."""

  teacher: Encoder
  student: Encoder
  objective: Objective
  tx: optax.GradientTransformation
  schedule: Callable
  train_step: Any  # jitted (state, batch, teacher_params, rng) -> (state, metrics): also `.lower`
  accumulate_steps: int

  def abstract_state(self) -> TrainState:
    return jax.eval_shape(partial(init_state, self.student, self.tx, self.objective), jax.random.key(0))


def build_step(config, teacher_config: EncoderConfig, mesh, masking, pooling) -> DistillationStep:
  """Validates `config` against its teacher's architecture and the mesh, and builds its step.
  `masking` (special token ids, mask id) serves the objectives that mask their inputs; `pooling`,
  the embedding objective."""
  teacher = Encoder(teacher_config.replace(dtype=config.dtype))
  student = Encoder(student_config(config, teacher_config))
  relations.check_relation_heads(config.loss.num_relation_heads, teacher_config.hidden_size, student.config.hidden_size)
  teacher_layer = resolve_layer(config.teacher.layer, teacher_config.num_layers, "teacher.layer")
  student_layer = resolve_layer(config.student.layer, student.config.num_layers, "student.layer")
  teacher_config.check_length(config.data.max_seq_length, "data.max_seq_length", "the teacher")
  objective = make_objective(
    config.loss, teacher_config, student.config, teacher_layer, student_layer, pooling, masking
  )
  parallel.check_batch_divides(config.batch_size, mesh)
  tx, schedule = make_optimizer(config.optimizer, config.num_steps)
  accumulate = config.optimizer.accumulate_steps
  check_accumulation(accumulate, config.batch_size // mesh.shape[parallel.DATA])
  train_step = make_train_step(teacher, student, tx, schedule, objective, mesh, accumulate)
  return DistillationStep(teacher, student, objective, tx, schedule, train_step, accumulate)


def teacher_pooling(config, pipeline: tuple | None = None):
  """The teacher's sentence-embedding pooling: what the embedding objective matches, and what the
  student's sentence-transformers export repeats. `pipeline`: the teacher's (pooling, Dense), when
  reading its weights gave it (a run's); else read from its files. A pipeline the objective cannot
  reproduce (or a teacher with its own Dense map) is an error only when the objective is used;
  otherwise the export falls back to mean pooling."""
  uses = uses_embedding_term(config.loss)
  try:
    pooling, dense = pipeline or runs.sentence_pipeline_of(config.teacher.path, config.data.max_seq_length)
  except UserError:
    if uses:
      raise
    return embeddings.Pooling(max_seq_length=config.data.max_seq_length)
  if dense is not None and uses:
    raise UserError(
      f"teacher {config.teacher.path} maps its embeddings through a Dense module, which the embedding "
      f"objective does not apply: use a teacher without one"
    )
  return pooling


@dataclasses.dataclass(frozen=True)
class Distillation:
  """A distillation run's parts, built and validated by `build_distillation` before any compute;
  `run()` trains them with the common loop."""

  config: Any
  workdir: str
  mesh: Mesh
  tokenizer: Any
  step: DistillationStep
  teacher_params: dict  # on the mesh; with the masked-LM head under "mlm_head" when the objective runs it
  stream: BatchStream
  heldout: dict | None  # the corpus blocks training never reads (`heldout_record`)
  evaluators: evaluators.Evaluators
  untrained: tuple  # parameters this objective leaves as initialised (an export names them)
  checkpoints: runs.RunCheckpoints
  student_params: dict | None  # ETD's extraction; None: random init, or a run that resumes

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
      (rng, self.student_params),
      parallel.replicated(self.mesh),
    )

  @property
  def num_steps(self) -> int:
    return self.config.num_steps

  def record(self) -> RunRecord:
    return student_record(self.config, self.step, self.untrained, self.heldout)

  def run(self) -> TrainState:
    state, next_batch = self.initial_state()  # before writing: a restore that fails leaves the workdir as it was
    if jax.process_index() == 0:
      runs.save_tokenizer(self.workdir, self.tokenizer)
    dropout_rng = jax.random.fold_in(jax.random.key(self.config.seed), 1)

    def step_fn(state, batch):
      return self.step.train_step(state, batch, self.teacher_params, dropout_rng)

    evaluate = (lambda step, state: self.evaluators(step, state.params)) if self.evaluators else None
    state = train_loop(self, state, next_batch, step_fn, LoopHooks("distill", evaluate=evaluate))
    if self.evaluators:
      speed = self.evaluators.speed(state.params)  # on every process: the encoders run on the whole mesh
      if jax.process_index() == 0:  # the one that wrote metrics.jsonl
        sizes = {"teacher": parameter_count(self.teacher_params), "student": parameter_count(state.params)}
        print("\n" + evaluators.summary(self.config, self.workdir, speed, sizes), flush=True)  # below the bars
    lock.release(self.workdir)  # its last write done: the workdir is free for the next program
    return state


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


def read_teacher(config, workdir: str, mesh) -> Shared:
  """The teacher of a run (`begin_run` checked it), checked against `config` (what every student
  shares: its `data` block)."""
  language_list(config.data)
  # The masked-LM head (soft labels, ETD-Impt) comes from the same read of the teacher's weights.
  # A teacher that is a run gives its sentence pipeline from the same opening of its checkpoints.
  teacher = runs.load_encoder(config.teacher.path, config.dtype, "teacher.path", mlm_head=True, sentence_pipeline=True)
  evaluators.check_lengths(config, teacher.config.max_position_embeddings)
  masking = (tuple(teacher.tokenizer.all_special_ids), teacher.tokenizer.mask_token_id)
  mesh = mesh or parallel.make_mesh()
  return Shared(config, workdir, mesh, teacher, masking, jax.device_put(teacher.params, parallel.replicated(mesh)))


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
  begin_run(config, workdir, distill_config.RANGES, distill_config.CONTRADICTIONS)
  check_settings(config)
  shared = read_teacher(config, workdir, mesh)
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
    student.step,
    student.teacher_params,
    shared.stream,
    heldout_record(shared.heldout),
    student.evaluators,
    student.untrained,
    checkpoints,
    student.start_params,
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
