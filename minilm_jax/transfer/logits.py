"""Task-distillation objectives of the thesis (section 3.2), each averaged over the batch: a
registry, `LOGIT_OBJECTIVES[name]`: its loss `(task, student_logits_BxC, batch, temperature)`, the batch
column it compares the student with, and what that asks of a run.

- "mse" (the thesis's choice, eq. 3.4): squared L2 distance between teacher and student logits.
- "soft_ce" (Hinton et al.): cross-entropy against the teacher's probabilities at temperature T,
  the student's also at T. Not rescaled by T^2: that keeps gradient sizes comparable when mixed
  with a hard-label loss, which the thesis found no help and we do not mix.
- "hard": the task's own loss against the gold labels (cross-entropy, or MSE for a regression
  task); the ablation rows' "trained on labels alone".
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from minilm_jax.errors import UserError


def _logit_mse(task, student_BxC, batch, temperature: float):
  return jnp.mean(jnp.sum((student_BxC - batch["teacher_logits"]) ** 2, axis=-1))


def _soft_cross_entropy(task, student_BxC, batch, temperature: float):
  target = jax.nn.softmax(batch["teacher_logits"] / temperature, axis=-1)
  return jnp.mean(-jnp.sum(target * jax.nn.log_softmax(student_BxC / temperature, axis=-1), axis=-1))


def _hard_labels(task, student_BxC, batch, temperature: float):
  return task.loss(student_BxC, batch)


@dataclasses.dataclass(frozen=True)
class TaskObjective:
  loss: Callable  # (task, student logits [B, C], batch, temperature) -> scalar
  # The teacher's logits (a teacher run per task; the training set augmented as the thesis does),
  # or the gold labels alone.
  from_teacher: bool
  classes_only: bool = False  # compares class probabilities: not for a regression task

  @property
  def column(self) -> str:
    """The batch column the loss compares the student with."""
    return "teacher_logits" if self.from_teacher else "label"


LOGIT_OBJECTIVES = {
  "mse": TaskObjective(_logit_mse, from_teacher=True),
  "soft_ce": TaskObjective(_soft_cross_entropy, from_teacher=True, classes_only=True),
  "hard": TaskObjective(_hard_labels, from_teacher=False),
}


def check_objective(objective: str, num_labels: int, task: str) -> TaskObjective:
  """The registered objective, checked against a task's labels."""
  if objective not in LOGIT_OBJECTIVES:
    raise UserError(f"objective={objective!r} is not one of {', '.join(LOGIT_OBJECTIVES)}")
  if LOGIT_OBJECTIVES[objective].classes_only and num_labels == 1:
    raise UserError(f"objective {objective!r} needs class probabilities, but {task} is a regression task: use 'mse'")
  return LOGIT_OBJECTIVES[objective]


def task_loss(objective: str, task, student_BxC, batch, temperature: float = 1.0):
  """`objective` on a batch holding `teacher_logits` (distillation) or `label` ("hard")."""
  return LOGIT_OBJECTIVES[objective].loss(task, student_BxC, batch, temperature)
