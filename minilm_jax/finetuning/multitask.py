"""Multi-task training of one body with a head per task (thesis chapter 4), and its first use: the
multi-task refined teacher (section 4.1.1), which the fine-tuning program trains when given
several tasks (`--config.task=sst2,mrpc`).

`MultiTaskRun` is what task distillation and multi-task refining share: every task's training rows
in its own `BatchStream`, the streams' batches merged and shuffled each epoch (algorithm 1), one
jitted train step per task (its inputs and head), each task's dev metrics after every epoch,
Orbax checkpoints and resume through the common training loop (`assemble_multitask_run`). Each
kind's builder supplies the model, the rows, the initial parameters and the optimizer.
"""

import dataclasses
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import Mesh

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, MultiTaskStream, stack_columns
from minilm_jax.devices import parallel
from minilm_jax.evaluation.predictor import Predictor
from minilm_jax.finetuning import config as finetuning_config
from minilm_jax.finetuning.fit import fit
from minilm_jax.finetuning.steps import make_train_step
from minilm_jax.models import sharding
from minilm_jax.models.students import refined_teacher
from minilm_jax.runs import lock
from minilm_jax.runs.record import REFINED_TEACHER, RunRecord
from minilm_jax.tasks import get_task
from minilm_jax.tasks.inputs import dummy_batch, model_inputs, parse_tasks, task_data_dirs, task_features
from minilm_jax.training.loop import begin_run, steps_of_epochs
from minilm_jax.training.train_state import Schedule, TrainState, adamw, check_accumulation, restore_or_init


@dataclasses.dataclass(frozen=True)
class MultiTaskSpec:
  """What a kind of multi-task run brings of its own (its builder makes it): the `tasks`, the
  `tokenizer`, the `model` (a body and a head per task) and whether it reads the `joint` sequence;
  `training_rows(task)`, a dataset with the model's inputs and the `target` column that
  `loss(task, logits, batch)` reads; `init_params(rng)`; `optimizer(num_steps) -> (optimizer, schedule)`
  (`optimizer(schedule)` the transformation, `schedule` the learning rate, the train step's argument);
  the run's `record`, what results.json says of it before its metrics (`summary`), and the
  progress bar's caption (`desc`)."""

  tasks: list
  tokenizer: Any
  model: nn.Module
  joint: bool
  loss: Callable
  target: str
  training_rows: Callable
  init_params: Callable
  optimizer: Callable
  record: RunRecord
  summary: dict
  desc: str


@dataclasses.dataclass(frozen=True)
class MultiTaskRun:
  """A multi-task run (`assemble_multitask_run` builds it from its kind's `spec`): the merged batch
  stream, one jitted train step and one predictor per task, the checkpoints; `run()` trains and
  evaluates them (`fit`)."""

  config: Any
  workdir: str
  mesh: Mesh
  spec: MultiTaskSpec
  stream: MultiTaskStream
  eval_data: dict  # (task name, split) -> (features, examples)
  num_steps: int
  state_shardings: TrainState
  schedule: Any  # the learning rate, the train steps' argument (`MultiTaskSpec.optimizer`)
  train_steps: dict  # task name -> jitted (state, batch, rng, schedule) -> (state, metrics)
  predictors: dict  # task name -> Predictor
  checkpoints: runs.RunCheckpoints
  init_state: Callable  # rng -> the fresh run's train state
  # Several tasks: no one metric picks a best epoch (results.json lists every epoch).
  selection_metric: None = None

  @property
  def tokenizer(self):
    return self.spec.tokenizer

  def record(self) -> RunRecord:
    return self.spec.record

  def initial_state(self):
    init = jax.jit(self.init_state, out_shardings=self.state_shardings)
    return restore_or_init(self.checkpoints, init, (jax.random.key(self.config.seed),))

  def evaluate(self, params) -> dict:
    """Every task's dev metrics, flat: {"<task>/dev/accuracy": ..., "<task>/dev/loss": ...}; the
    loss is against the gold labels (cross-entropy, or squared error for regression), what MKD's
    last stage picks its learning rate by."""
    results = {}
    for (name, split), (features, examples) in self.eval_data.items():
      task = get_task(name)
      outputs = self.predictors[name](params, features, desc=f"evaluate {name} {split}")
      results.update({f"{name}/{split}/{k}": v for k, v in task.score(task.predict(outputs), examples).items()})
      labels = jnp.asarray(examples["label"], jnp.int32 if task.labels else jnp.float32)
      results[f"{name}/{split}/loss"] = float(task.loss(jnp.asarray(outputs, jnp.float32), {"label": labels}))
    return results

  def run(self):
    def step_fn(state, batch, rng):
      task = batch.pop("task")
      return self.train_steps[task](state, batch, rng, self.schedule)

    return fit(self, step_fn, summary=self.spec.summary, desc=self.spec.desc)


def assemble_multitask_run(config, workdir: str, mesh, spec: MultiTaskSpec) -> MultiTaskRun:
  """What every multi-task run has (its streams, steps, predictors and checkpoints), built from
  what its kind brings (`spec`)."""
  tasks, model, joint = spec.tasks, spec.model, spec.joint
  c = config
  data_dirs = task_data_dirs(tasks, c.data_dir)
  parallel.check_batch_divides(c.batch_size, mesh)
  streams, eval_data = {}, {}
  for task in tasks:
    rows = spec.training_rows(task).select_columns(list(model_inputs(joint, task)) + [spec.target])
    streams[task.name] = BatchStream(
      rows, c.batch_size, c.seed, stack_columns, jax.process_index(), jax.process_count(), f"{task.name} training set"
    )
    for split in task.eval_splits:
      examples = task.load(split, data_dirs[task.name], "")
      eval_data[(task.name, split)] = (task_features(joint, task, examples, spec.tokenizer, c.max_seq_length), examples)
  stream = MultiTaskStream(streams, c.seed)
  num_steps = steps_of_epochs(c.epochs, stream.batches_per_epoch, "epochs")
  optimizer, schedule = spec.optimizer(num_steps)
  tx = optimizer(schedule)

  def init_state(rng):
    return TrainState.fresh(spec.init_params(rng), tx)

  state_shardings = sharding.tree_shardings(jax.eval_shape(init_state, jax.random.key(0)), mesh)
  check_accumulation(c.optimizer.accumulate_steps, c.batch_size // mesh.shape[parallel.DATA])

  def train_step(task):
    """The jitted train step on one task's batch (each task's inputs and head give it its own compile)."""

    def loss_of(params, batch, rngs):
      logits = model.apply({"params": params}, batch, task.name, deterministic=False, rngs=rngs)
      return spec.loss(task, logits, batch)

    return make_train_step(loss_of, optimizer, state_shardings, mesh, c.optimizer.accumulate_steps)

  def forward(name: str):
    return lambda params, batch: model.apply({"params": params}, batch, name)

  predictors = {
    t.name: Predictor(forward(t.name), mesh, state_shardings.params, c.eval_batch_size, model_inputs(joint, t))
    for t in tasks
  }
  return MultiTaskRun(
    config,
    workdir,
    mesh,
    spec,
    stream,
    eval_data,
    num_steps,
    state_shardings,
    schedule,
    {t.name: train_step(t) for t in tasks},
    predictors,
    runs.RunCheckpoints(workdir, c.checkpoint.every, c.checkpoint.keep),
    init_state,
  )


@lock.released_on_error
def build_multitask_finetuning(config, workdir: str, mesh=None) -> MultiTaskRun:
  """The multi-task refined teacher (thesis section 4.1.1, after MT-DNN): a pre-trained encoder
  shared by every task, one linear output layer per task on the pooled `[CLS]`, trained on the sum
  of the tasks' losses (cross-entropy; MSE for a similarity score) over their shuffled batches.
  The fine-tuning config's settings (AdamW, warm-up, epochs, dropout) apply."""
  begin_run(config, workdir, finetuning_config.RANGES)
  tasks = parse_tasks(config.task)
  encoder_config, encoder_params, tokenizer = runs.load_encoder(config.init, config.dtype, "init")[:3]
  encoder_config.check_length(config.max_seq_length, "max_seq_length")
  encoder_config = encoder_config.replace(hidden_dropout=config.dropout, attention_dropout=config.dropout)
  heads = tuple((t.name, t.head()["num_labels"]) for t in tasks)
  model = refined_teacher(encoder_config, heads)
  data_dirs = task_data_dirs(tasks, config.data_dir)

  def init_params(rng):
    params = model.init(rng, dummy_batch(True, tasks))["params"]
    return {**params, "body": {"encoder": encoder_params}}  # pre-trained encoder, fresh output layers

  names = tuple(t.name for t in tasks)
  spec = MultiTaskSpec(
    tasks=tasks,
    tokenizer=tokenizer,
    model=model,
    joint=True,
    loss=lambda task, logits, batch: task.loss(logits, batch),  # the tasks' own, on the gold labels
    target="label",
    training_rows=lambda task: task.features(
      task.load("train", data_dirs[task.name]), tokenizer, config.max_seq_length
    ),
    init_params=init_params,
    optimizer=lambda num_steps: (partial(adamw, config.optimizer), Schedule.of(config.optimizer, num_steps)),
    record=RunRecord(REFINED_TEACHER, encoder_config, json.loads(config.to_json()), heads=heads, tasks=names),
    summary={"tasks": list(names)},
    desc=f"multi-task refine {config.task}",
  )
  return assemble_multitask_run(config, workdir, mesh or parallel.make_mesh(config.mesh.data, config.mesh.model), spec)
