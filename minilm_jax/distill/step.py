"""MiniLM distillation's train step: written per device and mapped over the mesh axis `data` with
`jax.shard_map` (pmap semantics): each device runs teacher and student on its shard of the batch,
gradients are averaged with an explicit `pmean`, and every device applies the same update to its
replica. The teacher is an argument of the step, not part of the train state: no optimizer state,
never checkpointed, never donated. One step trains one student (`make_train_step`) or a family of
them from one teacher pass (`make_family_step`); `build_step` builds it from a config, for the
`train` program and for `minilm_jax.aot`.
"""

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
from minilm_jax.errors import UserError
from minilm_jax.models import embeddings
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.training.train_state import (
  TrainState,
  accumulated_value_and_grad,
  check_accumulation,
  guarded_update,
  make_optimizer,
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


def keyed_state(states: dict) -> TrainState:
  """One train state of a family from each student's (name -> `TrainState`, all at one step): their
  parameters and optimizer states keyed by name, as the family's step and checkpoint hold them."""
  first = next(iter(states.values()))
  return TrainState(first.step, {n: s.params for n, s in states.items()}, {n: s.opt_state for n, s in states.items()})


def _joined(states: dict, metrics: dict, family: bool) -> tuple:
  """The step's (state, metrics) from each student's: as they are for one student, keyed by name
  for a family."""
  if not family:
    return states[""], metrics[""]
  state = keyed_state(states)
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
