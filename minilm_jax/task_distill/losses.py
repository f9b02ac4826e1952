"""Task-distillation objectives of the thesis (section 3.2), each averaged over the batch: a
registry, `OBJECTIVES[name](task, student_logits_BxC, batch, temperature)`.

- "mse" (the thesis's choice, eq. 3.4): squared L2 distance between teacher and student logits.
- "soft_ce" (Hinton et al.): cross-entropy against the teacher's probabilities at temperature T,
  the student's also at T. Not rescaled by T^2: that keeps gradient sizes comparable when mixed
  with a hard-label loss, which the thesis found no help and we do not mix.
- "hard": the task's own loss against the gold labels (cross-entropy, or MSE for a regression
  task); the ablation rows' "trained on labels alone".
"""

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


OBJECTIVES = {"mse": _logit_mse, "soft_ce": _soft_cross_entropy, "hard": _hard_labels}
# The batch column each objective compares the student with.
TARGETS = {"mse": "teacher_logits", "soft_ce": "teacher_logits", "hard": "label"}


def check_objective(objective: str, num_labels: int, task: str):
  if objective not in OBJECTIVES:
    raise UserError(f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
  if objective == "soft_ce" and num_labels == 1:
    raise UserError(f"objective 'soft_ce' needs class probabilities, but {task} is a regression task: use 'mse'")


def task_loss(objective: str, task, student_BxC, batch, temperature: float = 1.0):
  """`objective` on a batch holding `teacher_logits` (distillation) or `label` ("hard")."""
  return OBJECTIVES[objective](task, student_BxC, batch, temperature)
