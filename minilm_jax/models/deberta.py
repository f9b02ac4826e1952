"""DeBERTa v2 and v3 (`deberta-v2`): disentangled attention, as transformers' `DebertaV2Model`.

Each layer's attention scores are the content-to-content product plus, by relative position, the
content-to-position (c2p: a query against the keys of the relative embeddings) and
position-to-content (p2c: a key against their queries) terms, all over sqrt(head_dim x (1 + the
terms)). Relative positions are log-bucketed (`position_buckets`) up to `max_relative_positions`;
the relative embeddings are one table for every layer, layer-normed (`norm_rel_ebd`), projected by
each layer's own query and key maps (`share_att_key`) or by its own position maps. The encoder's
layers expose their content queries, keys and values, which MiniLM's relations read
(docs/fidelity.md). Absolute positions only where the config asks (`position_biased_input`).
"""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from minilm_jax.errors import UserError
from minilm_jax.models.config import EncoderConfig

RELATIVE_TERMS = ("c2p", "p2c")  # the disentangled terms transformers implements


def config_from_hf(hf_config: dict) -> dict:
  """Our `EncoderConfig` fields of a `deberta-v2` config.json; one line for what we cannot honour."""
  terms = hf_config.get("pos_att_type") or []
  terms = terms.lower().split("|") if isinstance(terms, str) else list(terms)  # DeBERTa's own files: "p2c|c2p"
  unknown = sorted(set(terms) - set(RELATIVE_TERMS))
  if unknown:
    raise UserError(f"deberta-v2 pos_att_type {unknown}: transformers computes {', '.join(RELATIVE_TERMS)} alone")
  if hf_config.get("conv_kernel_size", 0) > 0:
    raise UserError(
      "deberta-v2 with conv_kernel_size > 0 (the convolution beside the first layer of DeBERTa-v2-xlarge "
      "and larger): not implemented; DeBERTa-v3 and v2-base have none"
    )
  relative = bool(hf_config.get("relative_attention", False))
  max_relative = hf_config.get("max_relative_positions", -1)
  if max_relative < 1:
    max_relative = hf_config.get("max_position_embeddings", 512)
  norms = [x.strip() for x in str(hf_config.get("norm_rel_ebd", "none")).lower().split("|")]
  return {
    "type_vocab_size": hf_config.get("type_vocab_size", 0),
    "embedding_size": 0
    if hf_config.get("embedding_size") in (None, hf_config["hidden_size"])
    else hf_config["embedding_size"],
    "absolute_positions": bool(hf_config.get("position_biased_input", True)),
    "relative_terms": ",".join(t for t in RELATIVE_TERMS if t in terms),  # in the scale, relative or not
    "position_buckets": max(hf_config.get("position_buckets", -1), 0) if relative else 0,
    "max_relative_positions": max_relative if relative else 0,
    "share_position_keys": bool(hf_config.get("share_att_key", False)),
    "norm_relative_embeddings": "layer_norm" in norms,
  }


def config_to_hf(config: EncoderConfig) -> dict:
  """The `deberta-v2` config.json fields of `config` (`config_from_hf`'s, the other way)."""
  terms = [t for t in config.relative_terms.split(",") if t]
  return {
    "type_vocab_size": config.type_vocab_size,
    "embedding_size": config.embedding_size or config.hidden_size,
    "position_biased_input": config.absolute_positions,
    "relative_attention": bool(config.max_relative_positions),
    "pos_att_type": terms,
    "position_buckets": config.position_buckets or -1,
    "max_relative_positions": config.max_relative_positions or -1,
    "share_att_key": config.share_position_keys,
    "norm_rel_ebd": "layer_norm" if config.norm_relative_embeddings else "none",
  }


def relative_positions(length: int, buckets: int, max_position: int) -> np.ndarray:
  """[L, L] relative position (query - key) of each pair, log-bucketed as transformers' DeBERTa
  buckets it (exact within buckets/2, then logarithmic up to `max_position`; `buckets` 0: exact),
  in float32 as it computes it."""
  relative = np.arange(length)[:, None] - np.arange(length)[None, :]
  if buckets <= 0 or max_position <= 0:
    return relative
  mid = buckets // 2
  sign = np.sign(relative)
  absolute = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative)).astype(np.float32)
  log_scale = np.float32(math.log((max_position - 1) / mid))
  with np.errstate(divide="ignore"):
    log_position = np.ceil(np.log(absolute / np.float32(mid)) / log_scale * np.float32(mid - 1)) + mid
  return np.where(absolute <= mid, relative, log_position * sign).astype(np.int64)


class RelativeEmbeddings(nn.Module):
  """The relative embeddings every layer reads ([2 x span, D], layer-normed where the config asks)
  and, for a sequence of L tokens, the row of each relative distance from L - 1 down to 1 - L in
  them (`by_distance`)."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, length: int):
    c = self.config
    span = c.position_buckets or c.max_relative_positions
    table = self.param("embedding", nn.initializers.normal(c.initializer_range), (2 * span, c.hidden_size), jnp.float32)
    if c.norm_relative_embeddings:
      table = nn.LayerNorm(
        epsilon=c.layer_norm_eps, param_dtype=jnp.float32, use_fast_variance=False, name="LayerNorm"
      )(table)
    return table, by_distance(length, span, c.position_buckets, c.max_relative_positions)


def by_distance(length: int, span: int, buckets: int, max_position: int) -> np.ndarray:
  """[2L - 1] row of the relative embeddings for each query-key distance d = L - 1 - j, j = 0..2L - 2
  (from L - 1 down to 1 - L): d's bucket offset by the span, clipped to the table, as transformers
  indexes its c2p term."""
  relative = relative_positions(length, buckets, max_position)  # [q, k]: the bucket of q - k
  row = np.concatenate([relative[length - 1, :], relative[0, 1:]])  # d = L - 1 ... 0, then -1 ... 1 - L
  return np.clip(row + span, 0, 2 * span - 1)


def _relative_shift(x):
  """y[..., q, k] = x[..., q, k + L - 1 - q] of x [..., L, 2L - 1], whose column j holds distance
  q - k = L - 1 - j: Transformer-XL's skew (one reshape and slice), which takes each pair's term
  from its distance's column without a gather (a per-entry gather is costly on TPUs)."""
  *lead, length, width = x.shape
  flat = x.reshape(*lead, length * width)[..., length - 1 : length - 1 + length * (width - 1)]
  return flat.reshape(*lead, length, width - 1)[..., :length]


def disentangled_bias(q_BxLxHxK, k_BxLxHxK, positions, position_maps, scale):
  """[B, H, L, L] float32 c2p and p2c terms of the scores (`positions`: `RelativeEmbeddings`'; the
  position maps: {"c2p": the key map of the relative embeddings, "p2c": the query map}, each a
  (kernel, bias)), over `scale` as transformers divides them. Each term is a product with the
  relative embedding of every distance ([B, H, L, 2L - 1]), shifted into place (`_relative_shift`)."""
  table, row = positions
  heads, head_dim = q_BxLxHxK.shape[2], q_BxLxHxK.shape[3]

  def projected(term, order):
    kernel, b = position_maps[term]
    return (table.astype(kernel.dtype) @ kernel + b)[order].reshape(-1, heads, head_dim)  # [2L - 1, H, K]

  bias = 0.0
  if "c2p" in position_maps:  # query q against the key of distance q - k
    keys = projected("c2p", row).astype(q_BxLxHxK.dtype)
    c2p = jnp.einsum("bqhd,jhd->bhqj", q_BxLxHxK, keys).astype(jnp.float32)
    bias = bias + _relative_shift(c2p) / scale
  if "p2c" in position_maps:  # key k against the query of distance q - k, read along the key's row
    queries = projected("p2c", row[::-1]).astype(k_BxLxHxK.dtype)
    p2c = jnp.einsum("bkhd,jhd->bhkj", k_BxLxHxK, queries).astype(jnp.float32)
    bias = bias + jnp.swapaxes(_relative_shift(p2c), -1, -2) / scale
  return bias
