"""Task-specific distillation in a fine-tuning run (`distill.teacher`): the student, any encoder a
fine-tuning run starts from (a general distillation's student, for TinyBERT's second stage), learns
a fine-tuned teacher of the same task instead of the gold labels.

- The targets: the teacher's logits on the training set, augmented as the thesis does when
  `augment.enabled` (masking and POS-guided replacement, `data/augment.py`), computed once and
  cached (`teachers.teacher_logits`); the loss is task distillation's `distill.objective` (logit
  MSE, the thesis's, or the teacher's probabilities at a temperature, `transfer/logits.py`).
  Several teachers (`distill.teacher` a comma list of runs of the task, e.g. one fine-tuning per
  seed): the mean of their logits, each teacher's cached on its own.
- Optionally the teacher's intermediate layers too (`distill.layers`, a distillation objective of
  `transfer/objectives.py`: `tinybert_layerwise` is TinyBERT's task stage, its embeddings, attention
  scores and hidden states at every layer of the uniform map), from the (first) teacher's encoder
  run on the same batch inside the step, times `distill.layers_weight`.

Everything else is the fine-tuning run's own: the head, the optimiser and its schedule, the epochs
(over the augmented set), the evaluation, the record: `evaluate`, `convert`, `--grid` and seeds work
on the result as on any fine-tuned run.
"""

import dataclasses
import hashlib
import os
from typing import Any

import datasets
import numpy as np

from minilm_jax import runs
from minilm_jax.data.augment import augmented as augment_examples
from minilm_jax.errors import UserError
from minilm_jax.finetuning.steps import TaskModel
from minilm_jax.finetuning.teachers import TeacherRun, find_teachers, teacher_logits, teacher_paths
from minilm_jax.models.encoder import Encoder
from minilm_jax.models.heads import MODEL_INPUTS, apply_model
from minilm_jax.tasks.glue import ClassificationTask
from minilm_jax.transfer.logits import TaskObjective, check_objective
from minilm_jax.transfer.objectives import DISTILLATION_OBJECTIVES, Objective, Outputs, loss_config, make_objective


@dataclasses.dataclass(frozen=True)
class TaskTeacher:
  """What a distilling fine-tuning run learns from: the teacher runs (their logits averaged), the
  objective on the logits and, with `distill.layers`, the objective on the first run's layers with
  its encoder and parameters (on the mesh)."""

  runs: tuple[TeacherRun, ...]
  logits: TaskObjective
  temperature: float
  layers: Objective | None = None
  layers_weight: float = 0.0
  encoder: Encoder | None = None
  params: Any = None  # the teacher encoder's parameters, an argument of the train step
  read_as: tuple[str, ...] = ()  # each run's `TeacherRun.content_digest`, taken once before its logits

  @property
  def digest(self) -> str:
    """The teacher runs as the run read them (`read_as`, in order): what a second stage records,
    and compares on a resume."""
    return hashlib.sha256("".join(self.read_as).encode()).hexdigest()

  @property
  def frozen(self) -> tuple:
    """The train step's arguments besides (state, batch, rng): the teacher encoder's parameters when
    its layers are learnt."""
    return () if self.layers is None else (self.params,)


def load_teacher(distill, student: TaskModel, init: str, mesh) -> TaskTeacher:
  """The teacher of `distill` (the config's `distill` block) checked against the student's task and
  model (its encoder and tokenizer, read from `init`)."""
  task, encoder_config, tokenizer = student.task, student.encoder_config, student.tokenizer
  num_labels = student.head["num_labels"]
  if not isinstance(task, ClassificationTask):
    raise UserError(f"distill.teacher distils classification and regression tasks; {task.name} is not one")
  if distill.layers and distill.layers not in DISTILLATION_OBJECTIVES:
    raise UserError(
      f"distill.layers={distill.layers!r} is no distillation objective: use one of "
      f"{', '.join(DISTILLATION_OBJECTIVES)}, or '' for the teacher's logits alone"
    )
  objective = check_objective(distill.objective, num_labels, task.name)
  if not objective.from_teacher:
    raise UserError(f"distill.objective={distill.objective} trains on the gold labels: leave distill.teacher empty")
  teachers = _teacher_runs(distill.teacher, task)
  if not distill.layers:
    return TaskTeacher(teachers, objective, distill.temperature)
  teacher = teachers[0]
  teacher_config, params, teacher_tokenizer = runs.read_run(teacher.path, teacher.step, mesh=mesh)[:3]
  if teacher_config.hidden_size != encoder_config.hidden_size:
    raise UserError(
      f"distill.layers={distill.layers} compares hidden states of width {encoder_config.hidden_size} (the student) "
      f"and {teacher_config.hidden_size} (distill.teacher): TinyBERT's learnt maps between widths are not kept "
      f"in a fine-tuning run; distil the logits alone (distill.layers='') or pick a teacher as wide"
    )
  if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
    raise UserError(
      f"distill.layers={distill.layers} runs the teacher on the student's tokens, but {teacher.path} has another "
      f"vocabulary than {init}: distil the logits alone (distill.layers='')"
    )
  loss = loss_config()
  loss.objective, loss.layer_map = distill.layers, "all"
  layers = make_objective(
    loss, teacher_config, encoder_config, teacher_config.num_layers - 1, encoder_config.num_layers - 1
  )
  if layers.needs.mlm_head:  # (learnt maps between widths are refused above: the widths are equal)
    raise UserError(f"distill.layers={distill.layers} needs masked-LM heads, which fine-tuned runs do not keep")
  encoder = Encoder(teacher_config)
  return TaskTeacher(
    teachers, objective, distill.temperature, layers, distill.layers_weight, encoder, params["encoder"]
  )


def _teacher_runs(teacher: str, task) -> tuple[TeacherRun, ...]:
  """The runs of `distill.teacher` (one, or a comma list), each a teacher of `task` with the first
  one's labels and vocabulary: their logits are averaged, so they must mean the same classes of the
  same texts."""
  paths = teacher_paths(teacher, "distill.teacher")
  if not paths:
    raise UserError(f"distill.teacher={teacher!r} names no run: give a fine-tuning workdir, or a comma list of them")
  real = [os.path.realpath(p) for p in paths]  # one run, however it is named (FT, FT/, a link to FT)
  twice = [p for p, r in zip(paths, real) if real.count(r) > 1]
  if twice:
    raise UserError(f"distill.teacher names one run twice ({' and '.join(twice[:2])}): list each teacher once")
  found = [find_teachers([path], [task])[task.name] for path in paths]
  first = found[0]
  vocabulary = runs.load_tokenizer_of(first.path).get_vocab() if len(found) > 1 else None
  for other in found[1:]:
    theirs, ours = other.record.task_outputs(task.name), first.record.task_outputs(task.name)
    if theirs != ours:
      raise UserError(
        f"distill.teacher: {other.path} predicts {theirs} for {task.name} but {first.path} {ours}: average "
        "teachers of one label set"
      )
    if runs.load_tokenizer_of(other.path).get_vocab() != vocabulary:
      raise UserError(
        f"distill.teacher: {other.path} has another vocabulary than {first.path}: average teachers "
        "fine-tuned from one model (e.g. one per seed)"
      )
  return tuple(found)


def teacher_features(
  teacher: TaskTeacher, student: TaskModel, examples: datasets.Dataset, config, cache_dir: str, mesh
) -> datasets.Dataset:
  """The training `examples` (augmented as the config's `augment` block says, when enabled) as the
  student task's features (of `max_seq_length` tokens) plus the teachers' mean logits
  (`teacher_logits`, `eval_batch_size` at a time, of the runs as `teacher.read_as` says they were
  read); all cached in `cache_dir`."""
  task, tokenizer, augment = student.task, student.tokenizer, config.augment
  max_len, batch_size = config.max_seq_length, config.eval_batch_size
  if augment.enabled:
    examples = augment_examples(examples, tokenizer.mask_token, augment, cache_dir, f"augment {task.name}")
  features = task.features(examples, tokenizer, max_len)
  logits = np.mean(
    [
      teacher_logits(run, task, examples, max_len, batch_size, mesh, cache_dir, read_as)
      for run, read_as in zip(teacher.runs, teacher.read_as, strict=True)
    ],
    axis=0,
  )
  return features.add_column("teacher_logits", [row.tolist() for row in logits.astype(np.float32)])


def _is_encoder(module, method_name: str) -> bool:
  """Captures the encoder's output (flax `capture_intermediates` filter)."""
  return isinstance(module, Encoder) and method_name == "__call__"


def distillation_loss(teacher: TaskTeacher, model, task):
  """`loss_of(params, batch, rngs, *teacher.frozen)` of the student task `model`: the objective on
  the teacher's logits (the batch's `teacher_logits`) plus, with `distill.layers`, that objective on
  the student's encoder (captured from the same forward pass) against the teacher's, run here."""

  def loss_of(params, batch, rngs, teacher_params=None):
    if teacher.layers is None:
      return teacher.logits.loss(task, apply_model(model, params, batch, False, rngs), batch, teacher.temperature)
    inputs = [batch[k] for k in MODEL_INPUTS]
    logits, captured = model.apply(
      {"params": params}, *inputs, deterministic=False, rngs=rngs, capture_intermediates=_is_encoder
    )
    (student,) = captured["intermediates"]["encoder"]["__call__"]
    layers = teacher.layers
    assert teacher.encoder is not None  # set with `layers` (load_teacher)
    teacher_out = layers.outputs(teacher.encoder, teacher_params, batch, layers.teacher_layers_needed)
    terms = layers(teacher_out, Outputs(student.layers, None, student.embeddings, student.last_hidden_state), batch, {})
    return teacher.logits.loss(task, logits, batch, teacher.temperature) + teacher.layers_weight * sum(terms.values())

  return loss_of
