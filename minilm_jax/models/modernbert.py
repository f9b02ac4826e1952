"""ModernBERT (`modernbert`), as transformers' `ModernBertModel`.

Pre-norm layers (a layer norm before the attention and before the feed-forward block, none before
the first layer's attention, one after the last layer), a gated feed-forward block (GeGLU: the
activation of one half of the first map times the other half), no biases in any map or norm, no
absolute positions or token types. Queries and keys are rotated by position (RoPE); the global
layers (every `global_attn_every_n_layers`-th, from the first) rotate with one base and attend to
every token, the others with another base and attend within a sliding window (`local_attention`
tokens: those at most half of it away on either side). The layers expose their queries and keys
after the rotation, which MiniLM's relations read (docs/fidelity.md).
"""

import jax.numpy as jnp
import numpy as np

from minilm_jax.errors import UserError
from minilm_jax.models.attention import Attending
from minilm_jax.models.config import GLOBAL_EVERY, EncoderConfig

_SLIDING, _GLOBAL = "sliding_attention", "full_attention"  # transformers' layer types
# What a ModernBERT checkpoint may set that the encoder does not reproduce, and the value it honours.
_FIXED = {"attention_bias": False, "mlp_bias": False, "norm_bias": False}


def config_from_hf(hf_config: dict) -> dict:
  """Our `EncoderConfig` fields of a `modernbert` config.json (transformers 4's keys,
  `global_attn_every_n_layers` and the two `*_rope_theta`, or 5's `layer_types` and
  `rope_parameters`); one line for what we cannot honour."""
  for key, value in _FIXED.items():
    if hf_config.get(key, value) != value:
      raise UserError(f"modernbert with {key}={hf_config[key]}: not implemented; ModernBERT-base and -large have none")
  depth = hf_config["num_hidden_layers"]
  every = hf_config.get("global_attn_every_n_layers", GLOBAL_EVERY)
  types = hf_config.get("layer_types") or [_SLIDING if i % every else _GLOBAL for i in range(depth)]
  unknown = sorted(set(types) - {_SLIDING, _GLOBAL})
  if unknown or len(types) != depth:
    raise UserError(f"modernbert layer_types {types}: give {depth} of {_GLOBAL!r} or {_SLIDING!r}")
  rope = hf_config.get("rope_parameters") or {}
  thetas = {}
  for kind, legacy, default in ((_GLOBAL, "global_rope_theta", 160_000.0), (_SLIDING, "local_rope_theta", 10_000.0)):
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise UserError(f"modernbert rope_type {params['rope_type']!r}: the encoder rotates by the default RoPE alone")
    thetas[kind] = float(params.get("rope_theta", hf_config.get(legacy, default)))
  return {
    "hidden_act": hf_config.get("hidden_activation", "gelu"),
    "layer_norm_eps": hf_config.get("norm_eps", 1e-5),
    "hidden_dropout": hf_config.get("mlp_dropout", 0.0),
    "attention_dropout": hf_config.get("attention_dropout", 0.0),
    "type_vocab_size": 0,
    "absolute_positions": False,
    "local_window": hf_config.get("local_attention", 128),
    "sliding_layers": tuple(i for i, layer_type in enumerate(types) if layer_type == _SLIDING),
    "rope_theta": thetas[_GLOBAL],
    "local_rope_theta": thetas[_SLIDING],
  }


def config_to_hf(hf_config: dict, config: EncoderConfig) -> dict:
  """`hf_config` (the BERT-named keys `models.hf` writes) as a `modernbert` config.json of `config`."""
  for key in ("hidden_act", "layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob", "type_vocab_size"):
    hf_config.pop(key, None)
  hf_config.pop("position_embedding_type", None)
  return {
    **hf_config,
    **_FIXED,
    "hidden_activation": config.hidden_act,
    "norm_eps": config.layer_norm_eps,
    "embedding_dropout": config.hidden_dropout,
    "mlp_dropout": config.hidden_dropout,
    "attention_dropout": config.attention_dropout,
    "local_attention": config.local_window,
    "layer_types": [_SLIDING if i in config.sliding_layers else _GLOBAL for i in range(config.num_layers)],
    "rope_parameters": {
      _GLOBAL: {"rope_type": "default", "rope_theta": config.rope_theta},
      _SLIDING: {"rope_type": "default", "rope_theta": config.local_rope_theta},
    },
  }


def taken_sliding_layers(teacher: EncoderConfig, taken: list) -> tuple:
  """A student's sliding layers when its layers are the teacher's `taken` ones: each keeps its kind."""
  return tuple(i for i, layer in enumerate(taken) if layer in teacher.sliding_layers)


def rotation(position_ids_BxL, head_dim: int, theta: float):
  """(cos, sin) [B, L, 1, K / 2] float32 of RoPE at `position_ids` with base `theta`, as transformers
  computes them (its inverse frequencies in float32; it repeats each table for the two halves of a
  head's dimensions, which `rotate` reads once)."""
  inverse = 1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
  angles = position_ids_BxL[..., None].astype(jnp.float32) * jnp.asarray(inverse, jnp.float32)
  return jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]


def rotate(x_BxLxHxK, rotation_tables):
  """Queries or keys rotated by position (RoPE, `rotation`'s tables), in float32, in x's dtype: each
  pair (x_i, x_(i + K/2)) turned by its angle, as transformers' `rotate_half` form computes it
  (written by halves: on a CPU the concatenated form took a tenth of a ModernBERT-base forward pass)."""
  cos, sin = rotation_tables
  x = x_BxLxHxK.astype(jnp.float32)
  half = x.shape[-1] // 2
  first, second = x[..., :half], x[..., half:]
  return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1).astype(x_BxLxHxK.dtype)


def layer_attending(config: EncoderConfig, mask_BxL, position_ids_BxL) -> dict:
  """What each kind of layer's attention reads: {False: a global layer's, True: a sliding one's}."""
  return {
    False: Attending(mask_BxL, rotation=rotation(position_ids_BxL, config.head_dim, config.rope_theta)),
    True: Attending(mask_BxL, rotation=rotation(position_ids_BxL, config.head_dim, config.local_rope_theta)),
  }
