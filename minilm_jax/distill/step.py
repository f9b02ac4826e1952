"""MiniLM distillation's train step: written per device and mapped over the mesh axis `data` with
`jax.shard_map` (pmap semantics): each device runs teacher and student on its shard of the batch,
gradients are averaged with an explicit `pmean`, and every device applies the same update to its
replica. The teacher is an argument of the step, not part of the train state: no optimizer state,
never checkpointed, never donated. One step trains a run's students from one teacher pass (a lone
run is a family of one); `build_train_step` builds it from the run's configs, for the `train`
program, `minilm_jax.aot` and `bench distill`.
"""

import copy
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.distill import etd
from minilm_jax.distill.family import LONE, said_of
from minilm_jax.errors import UserError
from minilm_jax.models import embeddings, modernbert
from minilm_jax.models.config import default_sliding_layers
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.training.reuse import config_key, reused
from minilm_jax.training.train_state import (
  Schedule,
  TrainState,
  accumulated_value_and_grad,
  adamw,
  check_accumulation,
  guarded_update,
)
from minilm_jax.transfer import relations
from minilm_jax.transfer.objectives import Objective, make_objective, uses_embedding_term


def student_config(config, teacher: EncoderConfig | None = None) -> EncoderConfig:
  """The student's encoder: its own depth and width, the teacher's vocabulary and embeddings layout.
  A student is of its teacher's architecture, or BERT-shaped on the teacher's vocabulary (its
  padding id and positions); a ModernBERT student's layers attend globally or within the window
  as the teacher's layers it is taken from (ETD), else as ModernBERT's of its depth. Without a
  teacher (shape checks of configs), defaults of the student's model type stand in."""
  s = config.student
  base = teacher or EncoderConfig.of_type(s.model_type, vocab_size=s.vocab_size)
  if base.vocab_size != s.vocab_size or s.model_type not in (base.model_type, "bert"):
    raise UserError(
      f"student is {s.model_type} with vocab {s.vocab_size} but the teacher is {base.model_type} with "
      f"vocab {base.vocab_size}: a student has its teacher's vocabulary and its architecture or BERT's: set "
      f"student.vocab_size={base.vocab_size} and student.model_type={base.model_type} (or bert)"
    )
  if s.model_type != base.model_type:  # BERT-shaped on the teacher's tokens
    if config.student.init == "etd":
      raise UserError(
        f"student.init=etd takes the teacher's layers, and a {s.model_type} student cannot hold a "
        f"{base.model_type} teacher's: set student.model_type={base.model_type}, or student.init=random"
      )
    base = EncoderConfig(
      model_type=s.model_type,
      vocab_size=base.vocab_size,
      max_position_embeddings=base.max_position_embeddings,
      type_vocab_size=max(base.type_vocab_size, 1),
      pad_token_id=base.pad_token_id,
      layer_norm_eps=base.layer_norm_eps,
      hidden_act=base.hidden_act,
    )
  sliding = ()
  if base.architecture.rotary:  # each layer attends as the teacher's layer it is taken from, or as its depth's
    taken = etd.select_layers(base.num_layers, s.num_layers, config.etd.layers) if s.init == "etd" else None
    sliding = modernbert.taken_sliding_layers(base, taken) if taken else default_sliding_layers(s.num_layers)
  return base.replace(
    num_layers=s.num_layers,
    sliding_layers=sliding,
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


# What reaches the step as its arguments (the parameters, the batch, the random key, the learning
# rates: the schedule of optimizer.lr over num_steps) or not at all (the corpus and its reading, the
# ETD start, evaluation, checkpoints, logging): runs differing only in them share one compiled step
# (`training.reuse`). The teacher enters the key by its architecture, not its path.
_STEP_ARGUMENTS = (
  "seed",
  "num_steps",
  "optimizer.lr",
  "optimizer.warmup_steps",
  "optimizer.warmup_proportion",
  "data.corpus",
  "data.corpus_config",
  "data.epochs",
  "data.heldout_blocks",
  "data.language_alpha",
  "data.languages",
  "data.num_proc",
  "data.prepared",
  "data.rows",
  "data.text_column",
  "teacher.path",
  "student.init",
  "etd",
  "eval_batch_size",
  "evaluators",
  "checkpoint",
  "log_every",
)


def init_state(student: Encoder, tx, objective, rng, params=None) -> TrainState:
  """A fresh train state: the given student parameters (ETD), or random ones, plus what the objective
  learns besides (`Objective.init_learned`: maps to the teacher's width, a masked-LM head)."""
  params = init_params(student.config, rng) if params is None else params
  return TrainState.fresh({**params, **objective.init_learned(rng, student.config)}, tx)


def jit_step(students: dict, mesh, accumulate_steps: int = 1):
  """`train_step(state, batch, teacher_params, rng, schedules) -> (state, metrics)` of `students`
  (name -> `DistillationStep`, all of one teacher), jitted with the state donated; `schedules` (name
  -> `train_state.Schedule`) are the students' learning rates, arguments so that runs differing only
  in them or in their length share the compiled step (`build_train_step`). The teacher runs once a
  batch, deterministically and as deep as the deepest layer any student reads; each student takes
  its own loss, gradient and update from it. `teacher_params` are the encoder's, with its masked-LM
  head under "mlm_head" when an objective runs it. With `accumulate_steps` K each device's batch
  runs as K micro-batches (teacher included) whose gradients are averaged before the one update.
  A lone run's state (`{LONE: step}`) and metrics are the student's own; a family's state has
  `params` and `opt_state` keyed by student, its metrics each student's under its name
  (`<name>/loss`, ...) with `loss` their sum, `lr` the first's and `skipped` any. `skipped` is 1
  where a non-finite loss or update was not applied (`guarded_update`)."""
  # Every student reads the same inputs (a family has no masking objective: `build_train_step`),
  # so the teacher's pass over them is shared; each student reads the layers its objective needs.
  first = next(iter(students.values()))
  teacher, keyed = first.teacher, list(students) != [LONE]
  depth = max(s.objective.teacher_layers_needed for s in students.values())

  def per_device(state, batch, teacher_params, rng, schedules):
    states = _member_states(state, students, keyed)
    step_rng = jax.random.fold_in(jax.random.fold_in(rng, state.step), jax.lax.axis_index(parallel.DATA))

    def value_and_grad(params, micro_batch, index):
      micro_rng = step_rng if accumulate_steps == 1 else jax.random.fold_in(step_rng, index)
      dropout_rng, inputs_rng = jax.random.split(micro_rng)
      inputs = first.objective.inputs(inputs_rng, micro_batch, teacher.config.vocab_size)
      # The named scopes (here and the optimizer's) put the step's parts apart in a profile
      # (`bench distill --profile`).
      with jax.named_scope("teacher"):
        teacher_out = first.objective.outputs(teacher, teacher_params, inputs, depth)

      def loss_fn(params):
        terms = {
          name: s.objective.student_terms(
            s.student,
            params[name],
            teacher_out._replace(layers=teacher_out.layers[: s.objective.teacher_layers_needed]),
            inputs,
            {"dropout": dropout_rng},
          )
          for name, s in students.items()
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
    for name, s in students.items():
      own = jax.lax.pmean({"loss": losses[name], **{f"loss_{k}": v for k, v in terms[name].items()}}, parallel.DATA)
      with jax.named_scope("optimizer"):
        tx = s.optimizer(schedules[name])
        new_states[name], skipped = guarded_update(states[name], grads[name], own["loss"], tx)
      lr = schedules[name](states[name].step)
      metrics[name] = {**own, "grad_norm": optax.tree.norm(grads[name]), "lr": lr, "skipped": skipped}
    return _joined(new_states, metrics, keyed)

  step = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(parallel.DATA), P(), P(), P()), out_specs=(P(), P()))
  return jax.jit(step, donate_argnums=0)


def _member_states(state: TrainState, names, keyed: bool) -> dict:
  if not keyed:
    return {LONE: state}
  return {n: TrainState(state.step, state.params[n], state.opt_state[n]) for n in names}


def keyed_state(states: dict) -> TrainState:
  """One train state of a family from each student's (name -> `TrainState`, all at one step): their
  parameters and optimizer states keyed by name, as the family's step and checkpoint hold them."""
  first = next(iter(states.values()))
  return TrainState(first.step, {n: s.params for n, s in states.items()}, {n: s.opt_state for n, s in states.items()})


def _joined(states: dict, metrics: dict, keyed: bool) -> tuple:
  """The step's (state, metrics) from each student's: as they are for a lone run, keyed by name
  for a family."""
  if not keyed:
    return states[LONE], metrics[LONE]
  state = keyed_state(states)
  flat = {f"{n}/{k}": v for n, m in metrics.items() for k, v in m.items()}
  rows = list(metrics.values())
  total = {
    "loss": sum(m["loss"] for m in rows),
    "lr": rows[0]["lr"],
    "skipped": jnp.max(jnp.stack([m["skipped"] for m in rows])),
  }
  return state, {**total, **flat}


def make_heldout_step(teacher: Encoder, student: Encoder, objective, mesh):
  """`heldout_step(params, batch, teacher_params, seed) -> {"loss", "loss_<term>"...}`: the train
  step's loss terms, deterministic (no dropout; the masking objectives' masks from `seed`, an int32),
  averaged over the mesh."""

  def per_device(params, batch, teacher_params, seed):
    rng = jax.random.fold_in(jax.random.key(seed), jax.lax.axis_index(parallel.DATA))
    inputs = objective.inputs(rng, batch, teacher.config.vocab_size)
    teacher_out = objective.outputs(teacher, teacher_params, inputs, objective.teacher_layers_needed)
    terms = objective.student_terms(student, params, teacher_out, inputs)
    return jax.lax.pmean({"loss": sum(terms.values()), **{f"loss_{k}": v for k, v in terms.items()}}, parallel.DATA)

  step = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(parallel.DATA), P(), P()), out_specs=P())
  return jax.jit(step)


@dataclasses.dataclass(frozen=True)
class DistillationStep:
  """One student's part of a run's step: the models, the objective it learns by, its optimizer at a
  schedule (`optimizer(schedule)`: `adamw` of its config) and its learning rates (`schedule`: a
  `Schedule`, or anything the step can take as an argument and call with the step count)."""

  teacher: Encoder
  student: Encoder
  objective: Objective
  optimizer: Callable[[Any], optax.GradientTransformation]
  schedule: Any

  @property
  def tx(self) -> optax.GradientTransformation:
    """Its optimizer; the state it makes is the same at any schedule."""
    return self.optimizer(self.schedule)

  def fresh_state(self, rng, params=None) -> TrainState:
    return init_state(self.student, self.tx, self.objective, rng, params)

  def abstract_state(self) -> TrainState:
    return jax.eval_shape(self.fresh_state, jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class TrainStep:
  """A run's students (name -> `DistillationStep`; a lone run's one under `LONE`) and their one
  jitted step: what the `train` program runs, what `minilm_jax.aot` compiles from shapes alone and
  what `bench distill` times."""

  students: dict
  jitted: Any  # (state, batch, teacher_params, rng, schedules) -> (state, metrics): also `.lower`
  init: Any = None  # jitted `fresh_state`, replicated on the mesh
  heldout: dict = dataclasses.field(default_factory=dict)  # name -> its `make_heldout_step`

  @property
  def schedules(self) -> dict:
    """The step's last argument: each student's learning rates, by name."""
    return {n: s.schedule for n, s in self.students.items()}

  @property
  def teacher(self) -> Encoder:
    return next(iter(self.students.values())).teacher

  @property
  def keyed(self) -> bool:
    """Whether the state and metrics are keyed by student: a family's are, a lone run's are not."""
    return list(self.students) != [LONE]

  def params_of(self, state: TrainState, name: str) -> dict:
    """Student `name`'s parameters in the run's state."""
    return state.params[name] if self.keyed else state.params

  def fresh_state(self, rng, starts: dict) -> TrainState:
    """The run's state at step 0: each student's as it would start alone (from `rng` and its start
    in `starts`, by name: ETD's extraction, or random), keyed by name in a family."""
    states = {n: s.fresh_state(rng, starts.get(n)) for n, s in self.students.items()}
    return keyed_state(states) if self.keyed else states[LONE]

  def abstract_state(self) -> TrainState:
    return jax.eval_shape(self.fresh_state, jax.random.key(0), {})


def build_train_step(members: dict, teacher_config: EncoderConfig, mesh, masking, poolings: dict) -> TrainStep:
  """The step of a run's students (`members`: name -> its distillation config, `family.members`),
  each validated against the teacher's architecture and the mesh (a family's errors said of its
  student). `masking` (the tokenizer's `Masking`) serves the objectives that mask their inputs;
  `poolings` (by name), each student's embedding objective's pooling of the teacher."""
  steps = {n: said_of(n, build_student_step, c, teacher_config, mesh, masking, poolings[n]) for n, c in members.items()}
  config = next(iter(members.values()))  # the batch and its split are the family's
  accumulate = config.optimizer.accumulate_steps
  check_accumulation(accumulate, config.batch_size // mesh.shape[parallel.DATA])
  # Runs whose students differ only in what reaches the step as its arguments share its program.
  key = (
    tuple((n, config_key(c, _STEP_ARGUMENTS)) for n, c in members.items()),
    teacher_config,
    mesh,
    masking,
    tuple(poolings[n] for n in members),
  )
  train_step = TrainStep(steps, *reused(key, lambda: _programs(steps, mesh, accumulate)))
  if train_step.keyed:
    for name, step in steps.items():
      if step.objective.needs.mlm_head:
        raise UserError(
          f"family student {name}: loss.objective={members[name].loss.objective} masks the inputs the teacher "
          "reads, which the family's students share: distil it alone"
        )
  return train_step


def _programs(steps: dict, mesh, accumulate: int) -> tuple:
  """The jitted programs of a run's students (`steps`): its train step, its initialiser and each
  student's held-out loss step (`TrainStep`'s fields after `students`)."""
  init = jax.jit(TrainStep(steps, None).fresh_state, out_shardings=parallel.replicated(mesh))
  heldout = {n: make_heldout_step(s.teacher, s.student, s.objective, mesh) for n, s in steps.items()}
  return jit_step(steps, mesh, accumulate), init, heldout


def build_student_step(config, teacher_config: EncoderConfig, mesh, masking, pooling) -> DistillationStep:
  """One student's part of the step, `config` validated against its teacher's architecture (ETD's
  extraction included) and the mesh."""
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
  if config.student.init == "etd":  # the extraction's shape checks, before any corpus is read
    etd.check_extractable(teacher_config, student.config)
    etd.select_layers(teacher_config.num_layers, student.config.num_layers, config.etd.layers)
  optimizer = partial(adamw, copy.deepcopy(config.optimizer))  # the step closes over it: as keyed, whatever changes
  return DistillationStep(teacher, student, objective, optimizer, Schedule.of(config.optimizer, config.num_steps))


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
