"""Task-distillation objectives of the thesis (section 3.2), each averaged over the batch.

- "mse" (the thesis's choice, eq. 3.4): squared L2 distance between teacher and student logits.
- "soft_ce" (Hinton et al.): cross-entropy against the teacher's probabilities at temperature T,
  the student's also at T. Not rescaled by T^2: that keeps gradient sizes comparable when mixed
  with a hard-label loss, which the thesis found no help and we do not mix.
- "hard": the usual loss against the gold labels (cross-entropy, or MSE for a regression task);
  the ablation rows' "trained on labels alone".
"""

import jax
import jax.numpy as jnp
import optax

from minilm_jax.errors import UserError

OBJECTIVES = ("mse", "soft_ce", "hard")


def check_objective(objective: str, num_labels: int, task: str):
  if objective not in OBJECTIVES:
    raise UserError(f"objective={objective!r} is not one of {', '.join(OBJECTIVES)}")
  if objective == "soft_ce" and num_labels == 1:
    raise UserError(f"objective 'soft_ce' needs class probabilities, but {task} is a regression task: use 'mse'")


def logit_mse(student_BxC, teacher_BxC):
  return jnp.mean(jnp.sum((student_BxC - teacher_BxC) ** 2, axis=-1))


def soft_cross_entropy(student_BxC, teacher_BxC, temperature: float):
  target = jax.nn.softmax(teacher_BxC / temperature, axis=-1)
  return jnp.mean(-jnp.sum(target * jax.nn.log_softmax(student_BxC / temperature, axis=-1), axis=-1))


def hard_label_loss(student_BxC, labels_B):
  if student_BxC.shape[-1] == 1:
    return jnp.mean((student_BxC[:, 0] - labels_B) ** 2)
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(student_BxC, labels_B.astype(jnp.int32)))


def task_loss(objective: str, student_BxC, batch, temperature: float = 1.0):
  """The objective on a batch holding `teacher_logits` (distillation) or `label` ("hard")."""
  if objective == "hard":
    return hard_label_loss(student_BxC, batch["label"])
  if objective == "soft_ce":
    return soft_cross_entropy(student_BxC, batch["teacher_logits"], temperature)
  return logit_mse(student_BxC, batch["teacher_logits"])
