"""The sharded fine-tuning step, with pjit semantics: `jax.jit` with NamedSharding in/out
shardings over a `data` x `model` mesh; parameters and optimizer moments sharded by `parallel`'s
rules, the batch split over `data`. XLA inserts the collectives, so the step is written for one
device. Fine-tuning, multi-task training and task distillation train through it; inference is
`evaluation.predictor`'s.
"""

import dataclasses
from typing import Any

import jax
import optax

from minilm_jax.devices import parallel
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.training.train_state import accumulated_value_and_grad, guarded_update


@dataclasses.dataclass(frozen=True)
class TaskModel:
  """What a fine-tuning run's model is built from: its task, the task's head (`task.head(config)`),
  the pre-trained encoder's architecture and its tokenizer."""

  task: Any
  head: dict
  encoder_config: EncoderConfig
  tokenizer: Any


def make_train_step(loss_of, optimizer, state_shardings, mesh, accumulate_steps: int = 1, frozen_shardings=()):
  """`train_step(state, batch, rng, schedule, *frozen) -> (state, metrics)` minimising `loss_of(params,
  batch, rngs, *frozen)` (`rngs`: dropout's, fresh each step and micro-batch) with the optimizer
  `optimizer(schedule)` builds (`train_state.adamw`'s partial): jitted with shardings, the state
  donated. `schedule` (`train_state.Schedule`), like the state and the batch, is an argument, so
  runs of other learning rates or lengths call the same compiled step. `frozen`: what the loss
  reads and does not train (a distilling teacher's parameters), one argument per entry of
  `frozen_shardings`, their shardings. `accumulate_steps` K averages the gradients of K
  micro-batches before the one update; `metrics["skipped"]` is 1 where a non-finite loss or update
  was not applied."""

  def step(state, batch, rng, schedule, *frozen):
    step_rng = jax.random.fold_in(rng, state.step)

    def value_and_grad(params, micro_batch, index):
      rngs = {"dropout": step_rng if accumulate_steps == 1 else jax.random.fold_in(step_rng, index)}
      return jax.value_and_grad(lambda p: (loss_of(p, micro_batch, rngs, *frozen), ()), has_aux=True)(params)

    (loss, _), grads = accumulated_value_and_grad(value_and_grad, state.params, batch, accumulate_steps)
    new_state, skipped = guarded_update(state, grads, loss, optimizer(schedule))
    return new_state, {
      "loss": loss,
      "grad_norm": optax.tree.norm(grads),
      "lr": schedule(state.step),
      "skipped": skipped,
    }

  replicated = parallel.replicated(mesh)
  return jax.jit(
    parallel.traced_on_mesh(step, mesh),
    in_shardings=(state_shardings, parallel.batch_sharding(mesh), replicated, replicated, *frozen_shardings),
    out_shardings=(state_shardings, replicated),
    donate_argnums=0,
  )
