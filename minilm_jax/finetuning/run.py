"""A fine-tuning run: a pre-trained encoder and a task's head trained on the task's training split
(`steps.make_train_step`), evaluated on its dev splits after every epoch (`evaluation.predictor.Predictor`)."""

import copy
import dataclasses
import json
import logging
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, stack_columns
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.evaluators import (
  FINETUNING_PROVIDES,
  Context,
  Evaluators,
  best_direction,
  check_lengths,
  check_specs,
)
from minilm_jax.evaluation.finetuned_runs import write_predictions
from minilm_jax.evaluation.predictor import Predictor, prediction_forward
from minilm_jax.finetuning import config as finetuning_config
from minilm_jax.finetuning.distillation import (
  TaskTeacher,
  distillation_loss,
  load_teacher,
  teacher_features,
)
from minilm_jax.finetuning.fit import fit
from minilm_jax.finetuning.steps import TaskModel, make_train_step
from minilm_jax.models import sharding
from minilm_jax.models.encoder import Encoder, EncoderConfig, extend_positions
from minilm_jax.models.heads import (
  abstract_model_params,
  apply_model,
  head_kind,
  init_task_params,
  masked_targets,
  task_model,
)
from minilm_jax.runs import lock
from minilm_jax.runs.record import FINETUNING, RunRecord, check_same_teacher
from minilm_jax.tasks import get_task, selection_metric
from minilm_jax.tasks.seq2seq import mask_targets
from minilm_jax.training.loop import begin_run, steps_of_epochs
from minilm_jax.training.reuse import config_key, reused
from minilm_jax.training.train_state import Schedule, TrainState, adamw, check_accumulation, restore_or_init


@dataclasses.dataclass(frozen=True)
class FineTuningStep:
  """The task model, optimizer and jitted functions of a fine-tuning config on a mesh: what the
  `finetune` program runs, and what `minilm_jax.aot` compiles from shapes alone. Built once per
  process for each `step_key` (`training.reuse`): a run's seed, learning rate, length and data are
  the functions' arguments."""

  key: tuple  # `step_key`'s
  mesh: Mesh
  encoder_config: EncoderConfig  # the pre-trained encoder's, with the config's dropout
  model: nn.Module
  optimizer: Callable  # Schedule -> optax transformation (`train_state.adamw`)
  state_shardings: TrainState
  train_step: Callable  # (state, batch, rng, schedule, *teacher.frozen) -> (state, metrics)
  init: Callable  # jitted (rng, pre-trained parameters) -> the fresh train state, sharded
  predict_forward: Callable  # (params, batch) -> outputs (a seq2seq task's: beam search), not jitted

  def predictor(self, batch_size: int) -> Predictor:
    """The sharded inference of `predict_forward` on batches of `batch_size`, reused likewise."""
    return reused(
      (self.key, "predict", batch_size),
      lambda: Predictor(self.predict_forward, self.mesh, self.state_shardings.params, batch_size),
    )


_MASKING_STREAM = 1  # folded into the step's dropout key: the masked targets' own random stream

# A fine-tuning config's fields that reach its step as arguments (the seed's random keys, the
# schedule of optimizer.lr over the epochs, the data, the pre-trained parameters) or not at all
# (evaluation, checkpoints, logging): runs differing only in them share one compiled step. The task
# enters `step_key` by its loss, the mesh as itself, `init` by its encoder's config and tokenizer.
_STEP_ARGUMENTS = (
  "task",
  "init",
  "data_dir",
  "data",
  "language",
  "epochs",
  "seed",
  "seeds",
  "optimizer.lr",
  "optimizer.warmup_proportion",
  "mesh",
  "eval_batch_size",
  "checkpoint",
  "evaluators",
  "log_every",
  "distill.teacher",
  "distill.cache_dir",
  "augment",
  "grid",
  "doc_stride",
  "n_best",
  "max_answer_length",
  "null_score_threshold",
)


def step_key(config, parts: TaskModel, mesh, teacher=None) -> tuple:
  """What a fine-tuning step is built from besides its arguments (`training.reuse`): the config's
  other fields, the encoder's architecture, the task's loss (its class; for a classification task
  whether it regresses) and head (its label names aside), the tokenizer's special tokens (the masked
  targets' and beam search's), the mesh, and the teacher encoder whose layers the loss reads."""
  task, tokenizer = parts.task, parts.tokenizer
  head = json.dumps({k: v for k, v in parts.head.items() if k != "labels"}, sort_keys=True)
  task_key = (type(task), getattr(task, "labels", ()) is None)
  specials = (tuple(sorted(tokenizer.all_special_ids)), tokenizer.sep_token_id, tokenizer.pad_token_id)
  teacher_encoder = None if teacher is None or teacher.encoder is None else teacher.encoder.config
  return (
    config_key(config, _STEP_ARGUMENTS),
    parts.encoder_config,
    head,
    task_key,
    specials + (tokenizer.mask_token_id,),
    mesh,
    teacher is not None,
    teacher_encoder,
  )


def fit_positions(config, encoder_config: EncoderConfig, head: dict) -> EncoderConfig:
  """`encoder_config` covering `config.max_seq_length`: a sequence-to-sequence model past its
  position table gets the table repeated (UniLM's CNN/DailyMail setting, total length 768 on a
  512-position model); any other model must fit."""
  if config.max_seq_length > encoder_config.max_position_embeddings and head_kind(head).generates:
    return encoder_config.replace(max_position_embeddings=config.max_seq_length)
  encoder_config.check_length(config.max_seq_length, "max_seq_length")
  return encoder_config


def build_step(config, parts: TaskModel, mesh, teacher=None) -> FineTuningStep:
  """Validates `config` against the mesh and builds its task model and steps on `parts` (the task,
  its head, the pre-trained encoder's architecture and tokenizer), or finds them built for an equal
  `step_key`; with a `teacher` (`distillation.load_teacher`) the step learns it instead of the gold
  labels, and takes `teacher.frozen` after (state, batch, rng, schedule)."""
  parallel.check_batch_divides(config.batch_size, mesh)
  check_accumulation(config.optimizer.accumulate_steps, config.batch_size // mesh.shape[parallel.DATA])
  key = step_key(config, parts, mesh, teacher)
  return reused(key, lambda: _new_step(key, config, parts, mesh, teacher))


def _new_step(key: tuple, config, parts: TaskModel, mesh, teacher) -> FineTuningStep:
  config = copy.deepcopy(config)  # the functions close over it: as it was keyed, whatever the caller changes
  task, head, tokenizer = parts.task, parts.head, parts.tokenizer
  encoder_config = parts.encoder_config.replace(hidden_dropout=config.dropout, attention_dropout=config.dropout)
  model = task_model(encoder_config, head)
  optimizer = partial(adamw, config.optimizer)
  tx = optimizer(Schedule.of(config.optimizer, 1))  # the state's structure: the same at any schedule
  abstract = jax.eval_shape(partial(TrainState.fresh, tx=tx), abstract_model_params(encoder_config, head))
  state_shardings = sharding.tree_shardings(abstract, mesh)
  loss_of = lambda params, batch, rngs: task.loss(apply_model(model, params, batch, False, rngs), batch, config)
  frozen_shardings: tuple = ()
  if teacher is not None:
    loss_of = distillation_loss(teacher, model, task)
    frozen_shardings = tuple(sharding.tree_shardings(p, mesh) for p in teacher.frozen)
  if masked_targets(head):  # UniLM's form: a fresh choice of masked target tokens every step
    one_pass_loss_of = loss_of
    mask = partial(
      mask_targets,
      mask_prob=config.seq2seq.mask_prob,
      pad_id=tokenizer.pad_token_id,
      mask_id=tokenizer.mask_token_id,
      vocab_size=encoder_config.vocab_size,
    )
    loss_of = lambda params, batch, rngs: one_pass_loss_of(
      params, mask(batch, jax.random.fold_in(rngs["dropout"], _MASKING_STREAM)), rngs
    )
  accumulate = config.optimizer.accumulate_steps
  train_step = make_train_step(loss_of, optimizer, state_shardings, mesh, accumulate, frozen_shardings)

  def init(rng, pretrained):
    params = init_task_params(encoder_config, head, rng)
    return TrainState.fresh({**params, **pretrained}, tx)  # pre-trained body, fresh task head

  forward = prediction_forward(task, model, config, tokenizer)
  init = jax.jit(init, out_shardings=state_shardings)
  return FineTuningStep(key, mesh, encoder_config, model, optimizer, state_shardings, train_step, init, forward)


@dataclasses.dataclass(frozen=True)
class FineTuning:
  """A fine-tuning run's parts, built and validated by `build_finetuning` before any compute;
  `run()` trains and evaluates them (`fit`)."""

  config: Any
  workdir: str
  mesh: Mesh
  model: TaskModel  # its task, the task's head, the encoder's architecture, the tokenizer
  step: FineTuningStep
  stream: BatchStream
  eval_data: dict  # split -> (features, context) of `task.prepare`
  num_steps: int
  schedule: Schedule  # the learning rate over `num_steps`, the train step's argument
  predict: Predictor
  pretrained: dict  # {"encoder": ...} and, for a generating head, the masked-LM head's parameters
  checkpoints: runs.RunCheckpoints
  teacher: TaskTeacher | None = None  # distill.teacher's: learnt instead of the gold labels
  evaluators: Evaluators | None = None  # config.evaluators

  @property
  def task(self):
    return self.model.task

  @property
  def head(self) -> dict:
    return self.model.head

  @property
  def tokenizer(self):
    return self.model.tokenizer

  @property
  def selection_metric(self) -> str:
    return selection_metric(self.task)  # results.json's best epoch

  def initial_state(self):
    return restore_or_init(self.checkpoints, self.step.init, (jax.random.key(self.config.seed), self.pretrained))

  def record(self) -> RunRecord:
    config = json.loads(self.config.to_json())
    weights = None if self.teacher is None else self.teacher.digest
    return RunRecord(
      FINETUNING, self.step.encoder_config, config, head=self.head, tasks=(self.task.name,), teacher_weights=weights
    )

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
    frozen = () if self.teacher is None else self.teacher.frozen

    def step_fn(state, batch, rng):
      return self.step.train_step(state, batch, rng, self.schedule, *frozen)

    evaluate = None
    if self.evaluators:
      run_evaluators = self.evaluators
      evaluate = lambda step, state: run_evaluators(step, state.params)
    return fit(self, step_fn, summary={"task": self.task.name}, desc=f"finetune {self.task.name}", evaluate=evaluate)


@lock.released_on_error
def build_finetuning(config, workdir: str, mesh=None) -> FineTuning:
  """Reads the task and the pre-trained encoder, validates `config` against them and the mesh, and
  returns the run's parts: every error a config can cause surfaces here, before any compute."""
  resumed = begin_run(config, workdir, finetuning_config.RANGES)
  task = get_task(config.task, config)
  check_specs(config, FINETUNING_PROVIDES, task)
  head = task.head(config)
  # A sequence-to-sequence model starts from init's masked-LM head, when it has one.
  pretrained = runs.load_encoder(config.init, config.dtype, "init", mlm_head=head_kind(head).generates)
  encoder_config, encoder_params, tokenizer = pretrained[:3]
  fitted = fit_positions(config, encoder_config, head)
  if fitted != encoder_config:
    logging.warning(
      "max_seq_length=%d exceeds %s's %d positions: its position embeddings are repeated to cover them",
      config.max_seq_length,
      config.init,
      encoder_config.max_position_embeddings,
    )
    encoder_params, encoder_config = extend_positions(encoder_params, config.max_seq_length), fitted
  check_lengths(config, encoder_config.max_position_embeddings)
  parts = TaskModel(task, head, encoder_config, tokenizer)
  mesh = mesh or parallel.make_mesh(config.mesh.data, config.mesh.model)
  parallel.check_batch_divides(config.batch_size, mesh)
  if config.distill.teacher:
    teacher, train_features = _second_stage(config, parts, mesh, workdir, resumed)
    columns = (*task.train_columns, teacher.logits.column)
  else:
    _refuse_teacher_settings(config.distill, config.augment, task.name)
    teacher, train_features, columns = None, task.prepare("train", config, tokenizer)[0], task.train_columns
  stream = BatchStream(
    train_features.select_columns(columns),
    config.batch_size,
    config.seed,
    stack_columns,
    jax.process_index(),
    jax.process_count(),
    f"{config.task} train split",
  )
  eval_data = {split: task.prepare(split, config, tokenizer) for split in task.eval_splits}
  num_steps = steps_of_epochs(config.epochs, stream.batches_per_epoch, "epochs")
  step = build_step(config, parts, mesh, teacher)
  predict = step.predictor(config.eval_batch_size)
  initial = {"encoder": encoder_params}
  if head_kind(head).generates:
    initial.update(_masked_lm_head(config.init, pretrained.mlm_head))
  best = best_direction(config)
  checkpoints = runs.RunCheckpoints(workdir, config.checkpoint.every, config.checkpoint.keep, best=best)
  run = FineTuning(
    config=config,
    workdir=workdir,
    mesh=mesh,
    model=parts,
    step=step,
    stream=stream,
    eval_data=eval_data,
    num_steps=num_steps,
    schedule=Schedule.of(config.optimizer, num_steps),
    predict=predict,
    pretrained=initial,
    checkpoints=checkpoints,
    teacher=teacher,
  )
  if not config.evaluators:
    return run
  # The embedding evaluators read the encoder with the pooling of the model it started from.
  pooling = runs.sentence_pipeline_of(config.init, config.max_seq_length)[0]
  context = Context(
    mesh,
    tokenizer,
    Encoder(step.encoder_config),
    pooling,
    config.max_seq_length,
    config.eval_batch_size,
    num_steps,
    learnt=False,
    task_evaluate=run.evaluate,
  )
  return dataclasses.replace(run, evaluators=Evaluators(config, context))


def _refuse_teacher_settings(distill, augment, task_name: str):
  """A plain fine-tuning run (no `distill.teacher`) refuses the settings only a teacher gives a use."""
  for given, field in ((augment.enabled, "augment.enabled"), (distill.layers, "distill.layers")):
    if given:
      raise UserError(
        f"{field} needs distill.teacher (the augmented examples and the layers are a fine-tuned "
        f"teacher's to label): set --config.distill.teacher=<a fine-tuning run of {task_name}>"
      )


def _second_stage(config, parts: TaskModel, mesh, workdir: str, resumed: RunRecord | None):
  """(the teacher, the training features with its logits) of a run with `distill.teacher`: the
  student learns a fine-tuned teacher of its task on the (augmented) training set, the targets
  cached in `distill.cache_dir` (default <workdir>/cache). A run resumed (`resumed`: its record)
  takes only the teachers it started from. Built only when a teacher is set: a plain run hands its
  config to none of it."""
  distill = config.distill
  teacher = load_teacher(distill, parts, config.init, mesh)
  # Each run's content, digested once: the record's, and the one its logits are cached under and
  # checked against after they are computed (`teacher_logits`), so the targets are of what is recorded.
  teacher = dataclasses.replace(teacher, read_as=tuple(run.content_digest() for run in teacher.runs))
  same = [run.path for run, digest in zip(teacher.runs, teacher.read_as) if teacher.read_as.count(digest) > 1]
  if same:  # one run under two real paths (a bind mount, a copy): it would weigh twice in the mean
    raise UserError(
      f"distill.teacher names one run twice: {' and '.join(same[:2])} hold the same checkpoint and tokenizer: "
      "list each teacher once"
    )
  check_same_teacher(f"distill.teacher={distill.teacher}", workdir, teacher.digest, resumed)
  examples = parts.task.load("train", config.data_dir, config.language)
  cache_dir = distill.cache_dir or os.path.join(workdir, "cache")
  return teacher, teacher_features(teacher, parts, examples, config, cache_dir, mesh)


def _masked_lm_head(init: str, head) -> dict:
  """The masked-LM head of `init` for a sequence-to-sequence model (a Hugging Face checkpoint
  saved with one), or {} (distilled students and encoder-only checkpoints: freshly initialised)."""
  if head is None:
    logging.warning(
      "%s has no masked-LM head: the sequence-to-sequence head (transform, its LayerNorm, the output "
      "bias) starts fresh; the output layer is the word embeddings",
      init,
    )
    return {}
  return dict(head)
