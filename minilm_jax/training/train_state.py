"""The train state, optimizer and update shared by distillation and fine-tuning: a run's state
restored or initialised (`restore_or_init`), gradient accumulation over micro-batches, and an
update that is skipped, on the device, when it would make the state non-finite."""

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import traverse_util
from jax.typing import ArrayLike

from minilm_jax.errors import UserError


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState

  @classmethod
  def fresh(cls, params, tx) -> "TrainState":
    """Step 0 of `params` under optimizer `tx`."""
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def restore_or_init(checkpoints, init, args: tuple):
  """(train state, index of the next batch) of a run: its latest checkpoint, restored onto the
  shardings `init`'s state would have, or `init(*args)` at batch 0. `init` is jitted with the
  state's out_shardings (a run's own, or one reused across runs: `training.reuse`). Restoring first
  means a failed restore leaves the workdir as it was."""
  if checkpoints.latest_step() is None:
    return init(*args), 0
  state, data, _ = checkpoints.restore(jax.eval_shape(init, *args))
  return state, data["next_batch"]


# The optimizer fields of every training program (`adamw_config`'s and the callers' warm-up), as
# `loop.check_fields` reads them: (least, bound to stay below).
OPTIMIZER_RANGES = {
  "optimizer.lr": (0, None),
  "optimizer.b1": (0, 1),
  "optimizer.b2": (0, 1),
  "optimizer.eps": (0, None),
  "optimizer.weight_decay": (0, None),
  "optimizer.clip_norm": (0, None),
  "optimizer.accumulate_steps": (1, None),
  "optimizer.warmup_steps": (0, None),
  "optimizer.warmup_proportion": (0, 1),
}


def adamw_config(lr: float, clip_norm: float) -> ml_collections.ConfigDict:
  """AdamW settings as the papers use them (betas 0.9/0.999, weight decay 0.01); callers add their warm-up field.
  `accumulate_steps` K splits every batch into K micro-batches whose gradients are averaged before
  one update: the update of the whole batch with the memory of one micro-batch."""
  return ml_collections.ConfigDict(
    dict(
      lr=lr,
      b1=0.9,
      b2=0.999,
      eps=1e-6,
      weight_decay=0.01,
      clip_norm=clip_norm,  # 0: no clipping
      accumulate_steps=1,
    )
  )


@flax.struct.dataclass
class Schedule:
  """The learning rate at each step: linear warm-up from 0 to `lr` over `warmup` steps, then linear
  decay to 0 at `num_steps` (BERT's). A pytree of scalars, so that a jitted step can take it as an
  argument: runs that differ only in their learning rate or length share one compiled step."""

  lr: ArrayLike  # float32
  warmup: ArrayLike  # int32, each below: as `of` computes them
  warmup_span: ArrayLike  # max(warmup, 1)
  decay_span: ArrayLike  # max(num_steps - warmup, 1)

  @classmethod
  def of(cls, opt, num_steps: int) -> "Schedule":
    """The schedule of an optimizer config over `num_steps`: the warm-up is `opt.warmup_proportion`
    of `num_steps` where a config gives that share (fine-tuning, ETD), else `opt.warmup_steps`."""
    share = opt.get("warmup_proportion", 0.0)
    warmup = min(int(share * num_steps) if share else opt.get("warmup_steps", 0), num_steps)
    steps = (warmup, max(warmup, 1), max(num_steps - warmup, 1))
    return cls(np.float32(opt.lr), *(np.int32(n) for n in steps))

  def __call__(self, count):
    # optax.join_schedules of two optax.linear_schedule, in their arithmetic (tests/test_steps.py
    # compares them bitwise), with every value an array rather than a constant.
    warming = _linear(0.0, self.lr, self.warmup_span, count)
    return jnp.where(count < self.warmup, warming, _linear(self.lr, 0.0, self.decay_span, count - self.warmup))


@flax.struct.dataclass
class ConstantRate:
  """A learning rate that does not change (task distillation's Adadelta and Adam), as a step's
  argument like `Schedule`."""

  lr: ArrayLike

  def __call__(self, count):
    return self.lr


def _linear(init, end, span, count):
  """optax.polynomial_schedule at power 1: `init` at count 0 to `end` at `span`, then `end`."""
  frac = 1 - jnp.clip(count, 0, span) / span
  return (init - end) * frac + end


def adamw(opt, schedule: Schedule) -> optax.GradientTransformation:
  """AdamW at `schedule`'s learning rates; no weight decay on biases and LayerNorm (as BERT); the
  global gradient norm clipped at `opt.clip_norm` (0: not clipped). Its state does not depend on
  `schedule`: a step may build it from the schedule it is given."""

  def decay_mask(params):
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({k: k[-1] in ("kernel", "embedding") for k in flat})

  tx = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=decay_mask)
  if opt.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm), tx)
  return tx


def check_accumulation(accumulate_steps: int, batch_per_device: int, what: str = "batch_size"):
  if accumulate_steps < 1 or batch_per_device % accumulate_steps:
    raise UserError(
      f"optimizer.accumulate_steps={accumulate_steps} does not split the {batch_per_device} examples "
      f"each device gets per step ({what} over the devices): use a divisor of {batch_per_device}"
    )


def _micro_batches(batch, k: int):
  """[B, ...] -> [k, B/k, ...], micro-batch j holding rows j, j+k, j+2k, ...: strided, so that a
  batch split over devices stays split the same way in every micro-batch."""
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), batch)


def accumulated_value_and_grad(value_and_grad, params, batch, accumulate_steps: int):
  """`value_and_grad(params, micro_batch, index) -> ((loss, aux), grads)` averaged over
  `accumulate_steps` micro-batches of `batch`, scanned so that one micro-batch is alive at a time.
  Equal to one pass over the whole batch when the loss is a mean over its examples."""
  if accumulate_steps == 1:
    return value_and_grad(params, batch, 0)
  micro = _micro_batches(batch, accumulate_steps)
  # The first micro-batch outside the scan: its result is the carry's initial value with exactly
  # the types (device-varying inside shard_map) that the body returns.
  first = value_and_grad(params, jax.tree.map(lambda x: x[0], micro), 0)

  def body(total, inputs):
    index, micro_batch = inputs
    return jax.tree.map(jnp.add, total, value_and_grad(params, micro_batch, index)), None

  rest = jax.tree.map(lambda x: x[1:], micro)
  total, _ = jax.lax.scan(body, first, (jnp.arange(1, accumulate_steps), rest))
  return jax.tree.map(lambda x: x / accumulate_steps, total)


def all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)] + [jnp.bool_(True)]))


def guarded_update(state: TrainState, grads, loss, tx):
  """(state after one optimizer update, skipped). The update is applied only if the loss and the
  new parameters and optimizer moments are all finite; otherwise the state keeps its parameters
  and moments (its step still advances), and `skipped` is 1. The check stays on the device, so the
  host need not read anything back every step, and a non-finite state can never be saved."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ok = jnp.isfinite(loss) & all_finite(params) & all_finite(opt_state)
  # The same values either way. On accelerators a select per leaf fuses into the update, which then
  # needs no copy of the state (a 6x384 step at batch 256 x 512 on one H100: 17.0 GiB at its peak,
  # 17.5 with a branch). XLA's CPU compiler takes 3-4x longer over those selects (a tiny BiLSTM
  # step: 13 s, 3.5 with a branch), so on CPUs one branch picks the kept or the updated state.
  params, opt_state = jax.lax.platform_dependent(
    ok,
    (params, opt_state),
    (state.params, state.opt_state),
    cpu=lambda ok, new, old: jax.lax.cond(ok, lambda: new, lambda: old),
    default=lambda ok, new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old),
  )
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), 1.0 - ok.astype(jnp.float32)
