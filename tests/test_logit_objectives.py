"""Task-distillation (logit) objectives against numpy/scipy written from the thesis's equations."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import log_softmax, softmax

from minilm_jax.errors import UserError
from minilm_jax.tasks import get_task
from minilm_jax.transfer.logits import check_objective, task_loss

SST2, MNLI = get_task("sst2"), get_task("mnli")  # "hard" is the task's own loss: three classes for MNLI


@pytest.fixture
def logits():
  rng = np.random.default_rng(0)
  return rng.normal(size=(6, 3)) * 2, rng.normal(size=(6, 3)) * 2, rng.integers(0, 3, 6)


def test_logit_mse_is_the_squared_distance_averaged_over_examples(logits):
  student, teacher, _ = logits
  expected = np.mean([np.sum((s - t) ** 2) for s, t in zip(student, teacher)])
  got = task_loss("mse", SST2, jnp.asarray(student), {"teacher_logits": jnp.asarray(teacher)})
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_soft_cross_entropy_uses_the_temperature_on_both_sides(logits, temperature):
  student, teacher, _ = logits
  expected = np.mean(-np.sum(softmax(teacher / temperature, -1) * log_softmax(student / temperature, -1), -1))
  got = task_loss("soft_ce", SST2, jnp.asarray(student), {"teacher_logits": jnp.asarray(teacher)}, temperature)
  np.testing.assert_allclose(float(got), expected, rtol=1e-5)


def test_hard_loss_is_cross_entropy_on_gold_labels_and_mse_for_regression(logits):
  student, _, labels = logits
  expected = np.mean(-log_softmax(student, -1)[np.arange(6), labels])
  np.testing.assert_allclose(
    float(task_loss("hard", MNLI, jnp.asarray(student), {"label": jnp.asarray(labels)})),
    expected,
    rtol=1e-5,
  )
  scores = np.linspace(0, 5, 6)
  got = task_loss("hard", get_task("stsb"), jnp.asarray(student[:, :1]), {"label": jnp.asarray(scores)})
  np.testing.assert_allclose(float(got), np.mean((student[:, 0] - scores) ** 2), rtol=1e-5)


def test_bad_objectives_are_one_line_errors():
  with pytest.raises(UserError, match="objective='kl'"):
    check_objective("kl", 2, "sst2")
  with pytest.raises(UserError, match="stsb is a regression task"):
    check_objective("soft_ce", 1, "stsb")
