"""Fine-tuning and evaluation with pjit semantics: `jax.jit` with NamedSharding in/out shardings
over a `data` x `model` mesh; parameters and optimizer moments sharded by `parallel`'s rules, the
batch split over `data`. XLA inserts the collectives, so the step is written for one device.
"""

import json
import logging
import os
from functools import partial

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tqdm import tqdm

from minilm_jax import checkpoint, parallel, runs
from minilm_jax.data.corpus import BatchStream, stack_columns
from minilm_jax.distributed import host_scalars
from minilm_jax.errors import UserError
from minilm_jax.loop import begin_run, fit
from minilm_jax.models.encoder import extend_positions
from minilm_jax.models.generation import generate
from minilm_jax.models.heads import SEQ2SEQ, Seq2SeqLM, task_model
from minilm_jax.train_state import (TrainState, accumulated_value_and_grad, check_accumulation, guarded_update,
                                     make_optimizer)

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def get_task(name: str, config=None):
  """A named task, or (`custom`) the one a fine-tuning config's `data` fields define."""
  from minilm_jax.tasks import custom, glue, seq2seq, squad, wordnet

  if name == "custom":
    if config is None or "data" not in config:
      raise UserError("task custom is defined by a fine-tuning config's data.* fields: fine-tune it on its own "
                      "(python -m minilm_jax.finetune --config.task=custom --config.data.train=...)")
    return custom.custom_task(config.data)
  tasks = {**glue.TASKS, **squad.TASKS, **wordnet.TASKS, **seq2seq.TASKS}
  if name not in tasks:
    raise UserError(f"unknown task {name!r}: choose one of {', '.join(sorted(tasks))}, or custom (your own files)")
  return tasks[name]


def selection_metric(task) -> str:
  """The metric that picks a run's best epoch and the grid's best setting: the task's first metric
  on its first dev split."""
  return f"{task.eval_splits[0]}/{task.metrics[0]}"


def task_forward(model):
  """`forward(params, batch) -> outputs` of a task model, for `Predictor`."""
  return partial(_apply, model)


def _apply(model, params, batch, deterministic=True, rngs=None):
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=deterministic, rngs=rngs)


def prediction_forward(task, model, config, tokenizer):
  """What evaluation computes on a batch: the task model's outputs, or for a sequence-to-sequence
  task its beam-search decoding (`{"tokens", "lengths"}`)."""
  if isinstance(model, Seq2SeqLM):
    return partial(generate, model, settings=task.decode_settings(config, tokenizer))
  return task_forward(model)


def write_predictions(task, predictions, examples, path: str):
  """`path`.json (id -> answer or generated text: SQuAD's official prediction format) or `path`.tsv
  (index and label name or score, as GLUE's submission files)."""
  if isinstance(predictions, dict):
    with open(path + ".json", "w") as f:
      json.dump(predictions, f, indent=1)
    return
  with open(path + ".tsv", "w") as f:
    f.write("index\tprediction\n")
    for idx, p in zip(examples["idx"], predictions):
      f.write(f"{idx}\t{p if task.labels is None else task.labels[int(p)]}\n")


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
    return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads), "lr": schedule(state.step), "skipped": skipped}

  replicated = parallel.replicated(mesh)
  return jax.jit(step, in_shardings=(state_shardings, parallel.batch_sharding(mesh), replicated),
                 out_shardings=(state_shardings, replicated), donate_argnums=0)


class Predictor:
  """Batched, sharded inference: `forward(params, batch)` on every row of a features dataset;
  `inputs` are the columns the batch takes (a task model's: the encoder inputs)."""

  def __init__(self, forward, mesh, param_shardings, batch_size: int, inputs=MODEL_INPUTS):
    parallel.check_batch_divides(batch_size, mesh)
    self.mesh, self.batch_size, self.inputs = mesh, batch_size, inputs
    self.forward = jax.jit(forward, in_shardings=(param_shardings, parallel.batch_sharding(mesh)),
                           out_shardings=parallel.replicated(mesh))

  def __call__(self, params, features, desc="predict"):
    local = self.batch_size // jax.process_count()
    offset = jax.process_index() * local
    outputs = []
    for start in tqdm(range(0, len(features), self.batch_size), desc=desc, unit="batch", leave=False,
                      disable=jax.process_index() != 0):
      rows = features[start:start + self.batch_size]
      n = len(rows["input_ids"])
      # The last batch is padded with copies of its last row (outputs dropped) to keep one compiled shape.
      batch = {k: np.asarray(rows[k] + [rows[k][-1]] * (self.batch_size - n))[offset:offset + local] for k in self.inputs}
      out = host_scalars(self.forward(params, parallel.shard_batch(batch, self.mesh)))
      outputs.append(jax.tree.map(lambda x: x[:n], out))
    return jax.tree.map(lambda *xs: np.concatenate(xs), *outputs)


class FineTuning:
  """A fine-tuning run, built and validated before any compute; `run()` trains and evaluates."""

  def __init__(self, config, workdir: str, mesh=None):
    begin_run(config, workdir)
    self.config, self.workdir = config, workdir
    self.task = get_task(config.task, config)
    encoder_config, encoder_params, self.tokenizer = runs.load_encoder(config.init, config.dtype, "init")
    self.head = self.task.head(config)
    if config.max_seq_length > encoder_config.max_position_embeddings and self.head["kind"] == SEQ2SEQ:
      # UniLM's CNN/DailyMail setting (total length 768) on a 512-position model.
      logging.warning("max_seq_length=%d exceeds %s's %d positions: its position embeddings are repeated to cover them",
                      config.max_seq_length, config.init, encoder_config.max_position_embeddings)
      encoder_params = extend_positions(encoder_params, config.max_seq_length)
      encoder_config = encoder_config.replace(max_position_embeddings=config.max_seq_length)
    if config.max_seq_length > encoder_config.max_position_embeddings:
      raise UserError(f"max_seq_length={config.max_seq_length} exceeds the model's {encoder_config.max_position_embeddings} positions")
    self.encoder_config = encoder_config.replace(hidden_dropout=config.dropout, attention_dropout=config.dropout)
    self.selection_metric = selection_metric(self.task)  # results.json's best epoch
    self.model = task_model(self.encoder_config, self.head)
    self.mesh = mesh or parallel.make_mesh(config.mesh.data, config.mesh.model)
    parallel.check_batch_divides(config.batch_size, self.mesh)
    train_features = self.task.prepare("train", config, self.tokenizer)[0]
    self.stream = BatchStream(train_features.select_columns(self.task.train_columns), config.batch_size, config.seed,
                              stack_columns, jax.process_index(), jax.process_count(), f"{config.task} train split")
    self.eval_data = {split: self.task.prepare(split, config, self.tokenizer) for split in self.task.eval_splits}
    self.num_steps = config.epochs * self.stream.batches_per_epoch
    optimizer = ml_collections.ConfigDict({**config.optimizer.to_dict(),
                                           "warmup_steps": int(config.optimizer.warmup_proportion * self.num_steps)})
    self.tx, self.schedule = make_optimizer(optimizer, self.num_steps)
    abstract = jax.eval_shape(lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=self.tx.init(p)),
                              runs.abstract_model_params(self.encoder_config, self.head))
    self.state_shardings = parallel.tree_shardings(abstract, self.mesh)
    self.abstract_state = parallel.placed(abstract, self.state_shardings)
    task_loss_of = self.task.loss
    if self.head["kind"] == SEQ2SEQ:
      task_loss_of = partial(self.task.loss, label_smoothing=config.seq2seq.label_smoothing)
    loss_of = lambda params, batch, rngs: task_loss_of(_apply(self.model, params, batch, False, rngs), batch)
    accumulate = config.optimizer.accumulate_steps
    check_accumulation(accumulate, config.batch_size // self.mesh.shape[parallel.DATA])
    self.train_step = make_train_step(loss_of, self.tx, self.schedule, self.state_shardings, self.mesh, accumulate)
    self.predict = Predictor(prediction_forward(self.task, self.model, config, self.tokenizer), self.mesh,
                             self.state_shardings.params, config.eval_batch_size)
    self._pretrained = {"encoder": encoder_params}
    if self.head["kind"] == SEQ2SEQ:
      self._pretrained.update(_masked_lm_head(config.init, self.encoder_config))
    self.checkpoints = checkpoint.RunCheckpoints(workdir, config.checkpoint.every, config.checkpoint.keep)

  def initial_state(self):
    if self.checkpoints.latest_step() is not None:
      state, data, _ = self.checkpoints.restore(self.abstract_state)
      return state, data["next_batch"]

    def init(rng, pretrained):
      params = runs.init_task_params(self.encoder_config, self.head, rng)
      params = {**params, **pretrained}  # pre-trained encoder (and masked-LM head), fresh task head
      return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.tx.init(params))

    state = jax.jit(init, out_shardings=self.state_shardings)(jax.random.key(self.config.seed), self._pretrained)
    return state, 0

  def meta(self) -> dict:
    return {"encoder": self.encoder_config.to_dict(), "head": self.head, "task": self.task.name,
            "config": json.loads(self.config.to_json())}

  def evaluate(self, params) -> dict:
    """Metrics of every evaluation split, flat: {"dev/accuracy": ...}."""
    results = {}
    for split, (features, context) in self.eval_data.items():
      outputs = self.predict(params, features, desc=f"evaluate {split}")
      scores, predictions = self.task.evaluate(outputs, features, context, self.config)
      results.update({f"{split}/{k}": v for k, v in scores.items()})
      if jax.process_index() == 0:  # the latest evaluation's, beside results.json
        write_predictions(self.task, predictions, context, os.path.join(self.workdir, f"{split}_predictions"))
    return results

  def run(self):
    def step_fn(state, batch, rng):
      return self.train_step(state, batch, rng)

    return fit(self, step_fn, summary={"task": self.task.name}, desc=f"finetune {self.task.name}")


def _masked_lm_head(init: str, config) -> dict:
  """The masked-LM head of `init` for a sequence-to-sequence model (a Hugging Face checkpoint
  saved with one), or {} (distilled students and encoder-only checkpoints: freshly initialised)."""
  head = runs.load_mlm_head(init, config)
  if head is None:
    logging.warning("%s has no masked-LM head: the sequence-to-sequence head (transform, its LayerNorm, the output "
                    "bias) starts fresh; the output layer is the word embeddings", init)
    return {}
  return dict(head)
