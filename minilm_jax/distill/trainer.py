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


def make_train_step(teacher: Encoder, student: Encoder, tx, schedule, objective, mesh, accumulate_steps: int = 1):
  """`train_step(state, batch, teacher_params, rng) -> (state, metrics)`, jitted with the state donated.
  `teacher_params` are the encoder's, with its masked-LM head under "mlm_head" when the objective
  runs it. With `accumulate_steps` K each device's batch runs as K micro-batches (teacher included)
  whose gradients are averaged before the one update. `metrics["skipped"]` is 1 where a non-finite
  loss or update was not applied (`guarded_update`)."""

  def per_device(state, batch, teacher_params, rng):
    step_rng = jax.random.fold_in(jax.random.fold_in(rng, state.step), jax.lax.axis_index(parallel.DATA))

    def value_and_grad(params, micro_batch, index):
      micro_rng = step_rng if accumulate_steps == 1 else jax.random.fold_in(step_rng, index)
      dropout_rng, inputs_rng = jax.random.split(micro_rng)
      inputs = objective.inputs(inputs_rng, micro_batch, teacher.config.vocab_size)
      # The teacher runs only up to the deepest layer the loss reads, deterministically. The named
      # scopes (here and the optimizer's) put the step's parts apart in a profile (`bench distill --profile`).
      with jax.named_scope("teacher"):
        teacher_out = objective.outputs(teacher, teacher_params, inputs, objective.teacher_layers_needed)

      def loss_fn(params):
        terms = objective.student_terms(student, params, teacher_out, inputs, {"dropout": dropout_rng})
        return sum(terms.values()), terms

      return jax.value_and_grad(loss_fn, has_aux=True)(params)

    # Cast the replicated parameters to device-varying: their gradient is then this device's own,
    # and the pmean below is the one and only reduction (without the cast, JAX >= 0.7 already sums
    # the gradient over devices and a pmean on top would scale it by the device count).
    params = jax.lax.pcast(state.params, parallel.DATA, to="varying")
    (loss, terms), grads = accumulated_value_and_grad(value_and_grad, params, batch, accumulate_steps)
    grads = jax.lax.pmean(grads, parallel.DATA)
    metrics = jax.lax.pmean({"loss": loss, **{f"loss_{k}": v for k, v in terms.items()}}, parallel.DATA)
    with jax.named_scope("optimizer"):
      new_state, skipped = guarded_update(state, grads, metrics["loss"], tx)
    return new_state, {**metrics, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step), "skipped": skipped}

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
  heldout: dict | None  # the corpus blocks training never reads (`_heldout_record`)
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
    return RunRecord(
      DISTILLATION,
      self.student.config,
      json.loads(self.config.to_json()),
      untrained=self.untrained,
      heldout=self.heldout,
      sentence_embedding={
        **self.objective.pooling.to_dict(),
        "dense": self.objective.projection_shapes().get("embedding"),
      },
    )

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


def _heldout_record(heldout) -> dict | None:
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


@lock.released_on_error
def build_distillation(config, workdir: str, mesh=None) -> Distillation:
  """Reads the teacher and the corpus, validates `config` against them and the mesh, and returns
  the run's parts (the step `build_step` gives, the batch stream, the evaluators, the checkpoints,
  the ETD start): every error a config can cause surfaces here, before any compute."""
  begin_run(config, workdir, distill_config.RANGES, distill_config.CONTRADICTIONS)
  evaluators.check_specs(config, evaluators.DISTILLATION_PROVIDES)
  language_list(config.data)
  if config.student.init not in ("random", "etd"):
    raise UserError(f"student.init={config.student.init!r}: use random or etd")
  # The masked-LM head (soft labels, ETD-Impt) comes from the same read of the teacher's weights.
  # A teacher that is a run gives its sentence pipeline from the same opening of its checkpoints.
  teacher = runs.load_encoder(config.teacher.path, config.dtype, "teacher.path", mlm_head=True, sentence_pipeline=True)
  teacher_config, teacher_params, tokenizer, _, mlm_head = teacher[:5]
  evaluators.check_lengths(config, teacher_config.max_position_embeddings)
  masking = (tuple(tokenizer.all_special_ids), tokenizer.mask_token_id)
  mesh = mesh or parallel.make_mesh()
  step = build_step(config, teacher_config, mesh, masking, teacher_pooling(config, teacher.sentence_pipeline))
  if step.objective.needs.mlm_head and mlm_head is None:
    raise UserError(
      f"loss.objective={config.loss.objective} needs the teacher's masked-LM head, and this teacher "
      f"has none: use a checkpoint saved with it (e.g. BertForMaskedLM) or another objective"
    )
  step_teacher = {**teacher_params, "mlm_head": mlm_head} if step.objective.needs.mlm_head else teacher_params
  step_teacher = jax.device_put(step_teacher, parallel.replicated(mesh))
  blocks, collate = corpus_blocks(config.data, tokenizer, os.path.join(workdir, "data"))
  blocks, heldout = split_heldout(blocks, config.data.heldout_blocks, config.batch_size)
  process = (jax.process_index(), jax.process_count())
  stream = BatchStream(blocks, config.batch_size, config.seed, collate, *process, f"corpus {config.data.corpus}")
  if config.data.epochs:  # a schedule in passes over the corpus (ETD's): its length is known now
    config.num_steps = steps_of_epochs(config.data.epochs, stream.batches_per_epoch, "data.epochs")
    step = build_step(config, teacher_config, mesh, masking, step.objective.pooling)
  heldout_stream, heldout_step = _heldout_evaluation(heldout, config, collate, step, mesh)
  context = evaluators.Context(
    mesh,
    tokenizer,
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
  checkpoints = runs.RunCheckpoints(
    workdir, config.checkpoint.every, config.checkpoint.keep, best=evaluators.best_direction(config)
  )
  student_params = None
  if config.student.init == "etd" and checkpoints.latest_step() is None:
    student_params = etd.initial_student_params(
      config.etd,
      teacher_config,
      jax.device_get(teacher_params),
      mlm_head,
      step.student.config,
      lambda n: corpus_first_sentences(config.data, os.path.join(workdir, "data"), n),
      tokenizer,
      config.data.max_seq_length,
    )
  return Distillation(
    config,
    workdir,
    mesh,
    tokenizer,
    step,
    step_teacher,
    stream,
    _heldout_record(heldout),
    evaluators.Evaluators(config, context),
    tuple(untrained),
    checkpoints,
    student_params,
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
