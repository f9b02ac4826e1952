"""The train steps as the programs call them (jitted, sharded over 8 fake devices): gradient
accumulation equals one larger batch, and the query-chunked relation loss inside the `shard_map`
step equals the full one."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from minilm_jax.devices import parallel
from minilm_jax.distill.step import LONE, DistillationStep, jit_step
from minilm_jax.errors import UserError
from minilm_jax.finetuning import steps as finetuning_steps
from minilm_jax.models import sharding
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.training.train_state import ConstantRate, Schedule, TrainState, check_accumulation
from minilm_jax.transfer.objectives import Objective

TEACHER = EncoderConfig(
  vocab_size=80, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, initializer_range=0.5
)
STUDENT = TEACHER.replace(
  hidden_size=16, intermediate_size=32, initializer_range=0.02, hidden_dropout=0.0, attention_dropout=0.0
)
# Plain SGD: the update is linear in the gradient, so a wrongly scaled gradient shows in the parameters.
SGD = optax.sgd(0.5)


def _batch(batch_size=32, length=12, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, batch_size)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
  return {
    "input_ids": rng.integers(1, 80, (batch_size, length)).astype(np.int32) * mask,
    "attention_mask": mask,
    "token_type_ids": np.zeros((batch_size, length), np.int32),
  }


def _distill_step(mesh, accumulate_steps=1, query_chunk=0, batch=None):
  objective = Objective("minilm", ((1, 1),), ("qk", "vv"), 4, query_chunk, 32, 16)
  parts = DistillationStep(Encoder(TEACHER), Encoder(STUDENT), objective, lambda rate: SGD, ConstantRate(0.5))
  step = jit_step({LONE: parts}, mesh, accumulate_steps=accumulate_steps)
  state = jax.jit(lambda: parts.fresh_state(jax.random.key(0)), out_shardings=parallel.replicated(mesh))()
  teacher_params = jax.device_put(init_params(TEACHER, jax.random.key(1)), parallel.replicated(mesh))
  batch = parallel.shard_batch(batch or _batch(), mesh)
  new_state, metrics = step(state, batch, teacher_params, jax.random.key(2), {LONE: parts.schedule})
  return jax.device_get(new_state.params), jax.device_get(metrics)


def _assert_same_step(a, b, rtol=1e-5):
  (params_a, metrics_a), (params_b, metrics_b) = a, b
  for name in ("loss", "grad_norm"):
    np.testing.assert_allclose(metrics_a[name], metrics_b[name], rtol=rtol, err_msg=name)
  for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
    np.testing.assert_allclose(x, y, atol=1e-6, rtol=rtol)


@pytest.mark.slow
@pytest.mark.parametrize("accumulate_steps", [4])
def test_distillation_accumulation_equals_one_larger_batch(accumulate_steps):
  """8 devices x 4 examples as `accumulate_steps` micro-batches against one pass. The MiniLM loss
  is a mean over examples, so the mean of micro-batch gradients is the whole batch's gradient."""
  mesh = parallel.make_mesh(8)
  _assert_same_step(_distill_step(mesh, accumulate_steps), _distill_step(mesh, 1))


@pytest.mark.slow
@pytest.mark.parametrize("query_chunk", [5])  # a partial last chunk of 2 rows
def test_chunked_loss_inside_the_sharded_step_equals_the_full_loss(query_chunk):
  mesh = parallel.make_mesh(8)
  _assert_same_step(_distill_step(mesh, query_chunk=query_chunk), _distill_step(mesh))
  # and with accumulation, both inside one scan body
  _assert_same_step(_distill_step(mesh, accumulate_steps=2, query_chunk=query_chunk), _distill_step(mesh))


def _finetune_step(mesh, accumulate_steps):
  model = Encoder(STUDENT)
  params = init_params(STUDENT, jax.random.key(0))
  targets = jnp.asarray(np.random.default_rng(3).standard_normal((32, 16)), jnp.float32)

  def loss_of(p, batch, rngs):  # a per-example regression of the [CLS] state: a mean over examples
    out = model.apply({"params": p}, batch["input_ids"], batch["attention_mask"], deterministic=False, rngs=rngs)
    return jnp.mean((out.last_hidden_state[:, 0] - batch["target"]) ** 2)

  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=SGD.init(params))
  shardings = sharding.tree_shardings(jax.eval_shape(lambda: state), mesh)
  step = finetuning_steps.make_train_step(loss_of, lambda rate: SGD, shardings, mesh, accumulate_steps)
  batch = {**_batch(), "target": np.asarray(targets)}
  rate = ConstantRate(np.float32(0.5))
  new_state, metrics = step(
    jax.device_put(state, shardings), parallel.shard_batch(batch, mesh), jax.random.key(1), rate
  )
  return jax.device_get(new_state.params), jax.device_get(metrics)


@pytest.mark.slow
def test_finetuning_accumulation_equals_one_larger_batch():
  mesh = parallel.make_mesh(4, 2)  # data x model: the micro-batches stay split over `data`
  _assert_same_step(_finetune_step(mesh, 4), _finetune_step(mesh, 1))


def test_accumulation_that_does_not_divide_the_batch_is_one_line_error():
  check_accumulation(4, 8)
  for bad in (3, 0):
    with pytest.raises(UserError, match=f"optimizer.accumulate_steps={bad} does not split the 8 examples"):
      check_accumulation(bad, 8)


@pytest.mark.parametrize(
  "lr, warmup_proportion, num_steps", [(1e-4, 0.1, 186), (3e-5, 0.1, 7), (6e-5, 0.0, 10), (0.1234567, 0.3, 3)]
)
def test_the_schedule_as_an_argument_equals_optax_s_as_constants(lr, warmup_proportion, num_steps):
  """The training steps take the learning-rate schedule as an argument (runs of other rates share a
  compiled step): at every step it is the rate of optax's warm-up and decay schedules with the
  values compiled in, as steps had them before. Bitwise under XLA's default flags; the suite's
  quick-compile flags (conftest.py) round a few rates 1 ulp apart, as they fuse the
  constants' arithmetic otherwise."""
  opt = ml_collections.ConfigDict({"lr": lr, "warmup_proportion": warmup_proportion})
  warmup = int(warmup_proportion * num_steps)
  theirs = optax.join_schedules(
    [optax.linear_schedule(0.0, lr, max(warmup, 1)), optax.linear_schedule(lr, 0.0, max(num_steps - warmup, 1))],
    [warmup],
  )
  counts = jnp.arange(num_steps + 2, dtype=jnp.int32)
  ours = jax.jit(jax.vmap(lambda count, schedule: schedule(count), in_axes=(0, None)))(
    counts, Schedule.of(opt, num_steps)
  )
  np.testing.assert_allclose(np.asarray(ours), np.asarray(jax.jit(jax.vmap(theirs))(counts)), rtol=3e-7, atol=0)
