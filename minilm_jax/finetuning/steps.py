"""The sharded fine-tuning and inference steps, with pjit semantics: `jax.jit` with NamedSharding
in/out shardings over a `data` x `model` mesh; parameters and optimizer moments sharded by
`parallel`'s rules, the batch split over `data`. XLA inserts the collectives, so the step is
written for one device. Fine-tuning, multi-task training, evaluation and task distillation's
teacher logits all run through them.
"""

from functools import partial

import jax
import numpy as np
import optax
from tqdm import tqdm

from minilm_jax.devices import parallel
from minilm_jax.devices.distributed import host_scalars
from minilm_jax.models.generation import generate
from minilm_jax.models.heads import Seq2SeqLM
from minilm_jax.training.train_state import accumulated_value_and_grad, guarded_update

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def task_forward(model):
  """`forward(params, batch) -> outputs` of a task model, for `Predictor`."""
  return partial(apply_model, model)


def apply_model(model, params, batch, deterministic=True, rngs=None):
  """A task model's outputs on a batch's encoder inputs."""
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=deterministic, rngs=rngs)


def prediction_forward(task, model, config, tokenizer):
  """What evaluation computes on a batch: the task model's outputs, or for a sequence-to-sequence
  task its beam-search decoding (`{"tokens", "lengths"}`)."""
  if isinstance(model, Seq2SeqLM):
    return partial(generate, model, settings=task.decode_settings(config, tokenizer))
  return task_forward(model)


def make_train_step(loss_of, tx, schedule, state_shardings, mesh, accumulate_steps: int = 1):
  """`train_step(state, batch, rng) -> (state, metrics)` minimising `loss_of(params, batch, rngs)`
  (`rngs`: dropout's, fresh each step and micro-batch): jitted with shardings, the state donated.
  `accumulate_steps` K averages the gradients of K micro-batches before the one update;
  `metrics["skipped"]` is 1 where a non-finite loss or update was not applied."""

  def step(state, batch, rng):
    step_rng = jax.random.fold_in(rng, state.step)

    def value_and_grad(params, micro_batch, index):
      rngs = {"dropout": step_rng if accumulate_steps == 1 else jax.random.fold_in(step_rng, index)}
      return jax.value_and_grad(lambda p: (loss_of(p, micro_batch, rngs), ()), has_aux=True)(params)

    (loss, _), grads = accumulated_value_and_grad(value_and_grad, state.params, batch, accumulate_steps)
    new_state, skipped = guarded_update(state, grads, loss, tx)
    return new_state, {
      "loss": loss,
      "grad_norm": optax.tree.norm(grads),
      "lr": schedule(state.step),
      "skipped": skipped,
    }

  replicated = parallel.replicated(mesh)
  return jax.jit(
    parallel.traced_on_mesh(step, mesh),
    in_shardings=(state_shardings, parallel.batch_sharding(mesh), replicated),
    out_shardings=(state_shardings, replicated),
    donate_argnums=0,
  )


class Predictor:
  """Batched, sharded inference: `forward(params, batch)` on every row of a features dataset;
  `inputs` are the columns the batch takes (a task model's: the encoder inputs)."""

  def __init__(self, forward, mesh, param_shardings, batch_size: int, inputs=MODEL_INPUTS):
    parallel.check_batch_divides(batch_size, mesh)
    self.mesh, self.batch_size, self.inputs = mesh, batch_size, inputs
    self.forward = jax.jit(
      parallel.traced_on_mesh(forward, mesh),
      in_shardings=(param_shardings, parallel.batch_sharding(mesh)),
      out_shardings=parallel.replicated(mesh),
    )

  def __call__(self, params, features, desc="predict"):
    local = self.batch_size // jax.process_count()
    offset = jax.process_index() * local
    outputs = []
    for start in tqdm(
      range(0, len(features), self.batch_size), desc=desc, unit="batch", leave=False, disable=jax.process_index() != 0
    ):
      rows = features[start : start + self.batch_size]
      n = len(rows["input_ids"])
      # The last batch is padded with copies of its last row (outputs dropped) to keep one compiled shape.
      batch = {
        k: np.asarray(rows[k] + [rows[k][-1]] * (self.batch_size - n))[offset : offset + local] for k in self.inputs
      }
      out = host_scalars(self.forward(params, parallel.shard_batch(batch, self.mesh)))
      outputs.append(jax.tree.map(lambda x, n=n: x[:n], out))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outputs)
