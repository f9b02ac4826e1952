"""Batched, sharded inference, with pjit semantics as the training steps (`jax.jit` with
NamedSharding over a `data` x `model` mesh): what every evaluation runs through (fine-tuning's dev
sets, the batch `evaluate` program, the sentence encoder of the embedding evaluators, task
distillation's teacher logits). `MODEL_INPUTS` and `apply_model` are a task model's inputs and
outputs (`models.heads`)."""

from functools import partial

import jax
import numpy as np
from tqdm import tqdm

from minilm_jax.devices import parallel
from minilm_jax.devices.distributed import host_scalars
from minilm_jax.models.generation import generate
from minilm_jax.models.heads import MODEL_INPUTS, Seq2SeqLM, apply_model


def task_forward(model):
  """`forward(params, batch) -> outputs` of a task model, for `Predictor`."""
  return partial(apply_model, model)


def prediction_forward(task, model, config, tokenizer):
  """What evaluation computes on a batch: the task model's outputs, or for a sequence-to-sequence
  task its beam-search decoding (`{"tokens", "lengths"}`)."""
  if isinstance(model, Seq2SeqLM):
    return partial(generate, model, settings=task.decode_settings(config, tokenizer))
  return task_forward(model)


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
