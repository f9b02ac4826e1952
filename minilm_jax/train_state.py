"""The train state and optimizer shared by distillation and fine-tuning."""

import flax.struct
import jax
import ml_collections
import optax
from flax import traverse_util


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState


def adamw_config(lr: float, clip_norm: float) -> ml_collections.ConfigDict:
  """AdamW settings as the papers use them (betas 0.9/0.999, weight decay 0.01); callers add their warm-up field."""
  return ml_collections.ConfigDict(dict(lr=lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                                        clip_norm=clip_norm))  # clip_norm 0: no clipping


def make_optimizer(opt, num_steps: int):
  """AdamW with linear warm-up then linear decay to 0; no weight decay on biases and LayerNorm (as BERT)."""
  warmup = min(opt.warmup_steps, num_steps)
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, opt.lr, max(warmup, 1)), optax.linear_schedule(opt.lr, 0.0, max(num_steps - warmup, 1))],
      [warmup])

  def decay_mask(params):
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict({k: k[-1] in ("kernel", "embedding") for k in flat})

  tx = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=decay_mask)
  if opt.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(opt.clip_norm), tx)
  return tx, schedule
