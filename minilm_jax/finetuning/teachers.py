"""Fine-tuned teachers of a task: the runs that teach each task (`find_teachers`), their forward
pass, and their logits on a training set (`teacher_logits`), computed once and cached on disk. Task
distillation (the thesis's students) and a fine-tuning run that distils (`distill.teacher`, the
second stage after a general distillation) learn from them."""

import dataclasses
import hashlib
import json
import os

import datasets
import jax
import numpy as np

from minilm_jax import runs
from minilm_jax.data.files import written_whole
from minilm_jax.errors import UserError
from minilm_jax.evaluation.predictor import Predictor, task_forward
from minilm_jax.models import sharding
from minilm_jax.models.heads import task_model
from minilm_jax.runs import lock
from minilm_jax.runs.checkpoints import step_digest
from minilm_jax.runs.reading import read_multitask_run
from minilm_jax.runs.record import RunRecord


@dataclasses.dataclass(frozen=True)
class TeacherRun:
  """A task-distillation teacher as `find_teachers` read it: its workdir, the checkpoint step whose
  record was read (the weights and the logits cache follow that step), and the record."""

  path: str
  step: int
  record: RunRecord

  def content_digest(self) -> str:
    """A digest of the teacher as its files now hold it: the checkpoint step's bytes and its
    tokenizer's (`checkpoints.step_digest`), wherever the run lies."""
    return step_digest(self.path, self.step, os.path.join(self.path, runs.TOKENIZER_DIR))


def teacher_paths(value: str, field: str) -> list:
  """The runs a comma list of teachers names (`distill.teacher`, task distillation's `teacher`); one
  line for one folder whose own name holds a comma, which the list would split."""
  paths = [p.strip() for p in value.split(",") if p.strip()]
  if len(paths) > 1 and os.path.isdir(value.strip()) and not all(os.path.exists(p) for p in paths):
    raise UserError(
      f"{field}={value!r} is one folder whose name holds a comma, which separates teachers in {field}: "
      f"rename it, or link it under a name without a comma and pass the link"
    )
  return paths


def find_teachers(teacher_runs: list, tasks: list) -> dict:
  """{task name: the first run that has an output layer for it (a fine-tuning run of the task, or a
  multi-task refined teacher trained on it)} as `TeacherRun`s; a one-line error for a task that has
  none. Each run's checkpoints are opened once here."""
  teaches: dict[str, TeacherRun] = {}
  for run in teacher_runs:
    if not runs.is_run(run):
      raise UserError(
        f"teacher {run} is not a run's workdir: pass fine-tuning workdirs (python -m minilm_jax.finetune)"
      )
    writer = lock.holder(run)
    if writer is not None:
      raise UserError(
        f"teacher {run} is still being written by {lock.describe(writer)}: let it finish, then rerun "
        "(a run read while it trains may delete the checkpoint read)"
      )
    ckpt = runs.RunCheckpoints(run, read_only=True)
    try:
      teacher = TeacherRun(run, *ckpt.read_step_and_record())
    finally:
      ckpt.close()
    for name in teacher.record.tasks if teacher.record.teaches_tasks else ():
      teaches.setdefault(name, teacher)
  missing = [t.name for t in tasks if t.name not in teaches]
  if missing:
    raise UserError(
      f"task {', '.join(missing)} has no teacher: none of teacher={','.join(teacher_runs)} was fine-tuned on "
      f"it; fine-tune one (python -m minilm_jax.finetune --config.task={missing[0]} ...) and add its workdir"
    )
  return {t.name: teaches[t.name] for t in tasks}


def teacher_forward(teacher: TeacherRun, task, mesh):
  """(forward(params, batch) -> the task's logits, params on `mesh`, tokenizer) of a teacher run, at
  the step its record was read at."""
  if teacher.record.multi_task:  # a refined teacher: one encoder, a head per task
    model, params, tokenizer, _, _ = read_multitask_run(teacher.path, mesh, teacher.step)
    return (lambda p, batch: model.apply({"params": p}, batch, task.name)), params, tokenizer
  encoder_config, params, tokenizer, head = runs.read_run(teacher.path, teacher.step, mesh=mesh)[:4]
  assert head is not None  # `find_teachers` takes only fine-tuning runs (with their head) and refined teachers
  return task_forward(task_model(encoder_config, head)), params, tokenizer


def teacher_logits(
  teacher: TeacherRun,
  task,
  examples: datasets.Dataset,
  max_len: int,
  batch_size: int,
  mesh,
  cache_dir: str,
  read_as: str = "",
) -> np.ndarray:
  """The teacher's logits [N, labels] for every example, batched through the jitted teacher; from
  the cache when a teacher of the same weights and tokenizer (its checkpoint's content, wherever the
  run lies) already labelled the same texts at the same length. The content is digested before the
  weights are read (or given: `read_as`, a caller's `TeacherRun.content_digest` taken before) and
  again after: a teacher rewritten in between is refused, so a cache file's name always says whose
  logits it holds."""
  weights = read_as or teacher.content_digest()
  digest = hashlib.sha256(json.dumps([weights, task.name, max_len]).encode())
  for a, b in zip(examples["text_a"], examples["text_b"]):
    digest.update(f"{a}\x00{b}\x01".encode())
  path = os.path.join(cache_dir, f"{task.name}-teacher-{digest.hexdigest()[:20]}.npy")
  if os.path.isfile(path):
    return np.load(path)
  forward, params, tokenizer = teacher_forward(teacher, task, mesh)
  predict = Predictor(forward, mesh, sharding.tree_shardings(params, mesh), batch_size)
  logits = predict(params, task.features(examples, tokenizer, max_len), desc=f"teacher logits {task.name}")
  if teacher.content_digest() != weights:  # replaced while it was read: the cache's name would lie
    raise UserError(
      f"teacher {teacher.path} changed while its weights were read for its logits: let whatever rewrites it "
      "finish, then rerun"
    )
  if jax.process_index() == 0:
    os.makedirs(cache_dir, exist_ok=True)
    with written_whole(path) as pending:  # an interrupted write never looks cached
      np.save(pending, logits)
  return logits
