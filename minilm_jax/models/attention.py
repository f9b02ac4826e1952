"""The attention paths of an encoder layer (`models.encoder.SelfAttention`): the fused kernels
(cuDNN's, our flash kernel on TPUs, XLA's), the explicit scores and probabilities where they are
returned or dropped out, what biases or masks them (`ScoreTerms`, `Attending`), and the heads'
layout."""

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from minilm_jax.kernels import attention as attention_kernel
from minilm_jax.kernels import dropout as dropout_bits
from minilm_jax.kernels.attention import MASK_VALUE
from minilm_jax.kernels.platform import compute_platform, kernel_platform


def split_heads(x_BxLxD, num_heads):
  b, l, d = x_BxLxD.shape
  return x_BxLxD.reshape(b, l, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x_BxHxLxK):
  b, h, l, k = x_BxHxLxK.shape
  return x_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * k)


def _key_mask(mask):
  """[B, Lk] padding mask (every query sees the same keys) or [B, Lq, Lk] per-query mask ->
  [B, 1, Lq or 1, Lk], broadcastable over heads."""
  return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]


def _visible(mask, window: int):
  """[B, 1, Lq or 1, Lk]: the keys each query sees (`_key_mask`), within `window` / 2 of it where a
  window is set."""
  seen = _key_mask(mask)
  if not window:
    return seen
  queries, keys = seen.shape[2] if mask.ndim == 3 else mask.shape[1], mask.shape[-1]
  near = jnp.abs(jnp.arange(queries)[:, None] - jnp.arange(keys)[None, :]) <= window // 2
  return jnp.logical_and(seen, near)


def _neighbours(x, blocks: int, size: int):
  """[B, blocks * size, ...] -> [B, blocks, 3 * size, ...]: each block beside the blocks before and
  after it (zeros beyond either end)."""
  x = x.reshape(x.shape[0], blocks, size, *x.shape[2:])
  zeros = jnp.zeros_like(x[:, :1])
  return jnp.concatenate(
    [jnp.concatenate([zeros, x[:, :-1]], axis=1), x, jnp.concatenate([x[:, 1:], zeros], axis=1)], axis=2
  )


def local_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_BxL, terms: "ScoreTerms"):
  """Context [B, L, H, K] of attention within `terms.window` (keys at most half of it from their
  query) under a [B, L] padding mask, by blocks of half the window: each block of queries against
  its own block of keys and the two beside it, [B, H, L, 1.5 x window] scores rather than
  [B, H, L, L] (at ModernBERT's 8,192 tokens and 128-token window, 1/43 of them) on every platform;
  cuDNN's kernel takes no window on both sides of a query. Equal to the dense attention with the
  window for every query that sees a key."""
  batch, length, heads, head_dim = q_BxLxHxK.shape
  size = terms.window // 2
  blocks = -(-length // size)
  pad = blocks * size - length
  if pad:
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (
      jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (q_BxLxHxK, k_BxLxHxK, v_BxLxHxK)
    )
    mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, pad)))
  q = q_BxLxHxK.reshape(batch, blocks, size, heads, head_dim)
  k, v, seen = (_neighbours(x, blocks, size) for x in (k_BxLxHxK, v_BxLxHxK, mask_BxL.astype(bool)))
  scale = np.sqrt(head_dim) if terms.scale is None else terms.scale
  scores = jnp.einsum("bnqhd,bnkhd->bnhqk", q, k).astype(jnp.float32) / jnp.float32(scale)
  distance = np.arange(3 * size)[None, :] - size - np.arange(size)[:, None]  # key - query, [size, 3 size]
  visible = jnp.logical_and(np.abs(distance) <= size, seen[:, :, None, None, :])
  probs = jax.nn.softmax(jnp.where(visible, scores, MASK_VALUE), axis=-1)
  context = jnp.einsum("bnhqk,bnkhd->bnqhd", probs.astype(v.dtype), v)
  return context.reshape(batch, blocks * size, heads, head_dim)[:, :length]


def fused_attention_implementation(dtype, head_dim: int, platform: str | None = None) -> str:
  """Which kernel `jax.nn.dot_product_attention` runs: cuDNN's flash attention on GPUs for the
  half-precision dtypes and head sizes it supports, XLA's (the same einsum-softmax-einsum as the
  explicit path, without returning the probabilities) everywhere else."""
  on_gpu = (platform or compute_platform()) in ("gpu", "cuda")
  if on_gpu and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128:
    return "cudnn"
  return "xla"


class ScoreTerms(NamedTuple):
  """What attention scores add to the content product (a [1 or B, H, L, L] bias by relative position:
  MPNet's, DeBERTa's c2p and p2c; None: BERT's), what divides them (None: sqrt(head_dim)), and the
  sliding window that leaves out the keys further than half of it from their query (ModernBERT's
  sliding layers; 0: none)."""

  bias: jax.Array | None = None
  scale: float | None = None
  window: int = 0


class Attending(NamedTuple):
  """What a layer's attention reads besides its input: the keys each query sees ([B, L] or [B, L, L]),
  what the encoder computed once of relative positions (`Encoder._relative_positions`) and the
  rotation of its queries and keys by position (`modernbert.rotation`'s tables). Arrays alone
  (a pytree that `nn.remat` traces); a layer's window is its own (`SelfAttention.sliding`)."""

  mask: jax.Array
  positions: Any = None
  rotation: Any = None


def fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, terms: ScoreTerms = ScoreTerms()):
  """Context [B, L, H, K] of fused attention under a [B, Lk] padding mask or a [B, Lq, Lk] mask,
  the scores biased by `terms` (relative positions: XLA's kernel, which takes a bias where cuDNN's
  and ours do not) and within its window (`local_attention`).
  cuDNN's kernel takes padding as per-row lengths, not as a mask (in bfloat16 it rejects a mask
  broadcast over queries: "Bias must have same seq length as QKV"); our padding is on the right
  (packed blocks, tokenizers' right padding), so a row's length is its count of real tokens. On
  TPUs our flash kernel (`kernels.attention`, without dropout) keeps the [B, H, L, L] scores out
  of HBM, where XLA's attention writes them. A per-query mask (sequence-to-sequence) stays with
  XLA's kernel."""
  head_dim = q_BxLxHxK.shape[-1]
  if terms.bias is not None:
    return jax.nn.dot_product_attention(
      q_BxLxHxK,
      k_BxLxHxK,
      v_BxLxHxK,
      bias=terms.bias.astype(q_BxLxHxK.dtype),
      mask=_visible(mask, terms.window),
      scale=None if terms.scale is None else 1.0 / terms.scale,
      implementation="xla",
    )
  if terms.window:  # by blocks where they do less work than the dense scores (longer than 1.5 windows)
    if mask.ndim == 2 and q_BxLxHxK.shape[1] > 3 * (terms.window // 2):
      return local_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, terms)
    visible = _visible(mask, terms.window)
    return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask=visible, implementation="xla")
  implementation = fused_attention_implementation(q_BxLxHxK.dtype, head_dim)
  if implementation == "cudnn" and mask.ndim == 2:
    lengths_B = jnp.sum(mask, axis=-1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(
      q_BxLxHxK,
      k_BxLxHxK,
      v_BxLxHxK,
      query_seq_lengths=lengths_B,
      key_value_seq_lengths=lengths_B,
      implementation="cudnn",
    )
  if mask.ndim == 2 and kernel_platform() == "tpu" and attention_kernel.supported(mask.shape[1], head_dim, "tpu"):
    return attention_kernel.flash_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, 0, 0.0, "tpu")
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask=_key_mask(mask), implementation="xla")


class ScopeRng(nn.Module):
  """The "dropout" rng of this module's scope: what an `nn.Dropout` of the same name would draw."""

  @nn.compact
  def __call__(self):
    return self.make_rng("dropout")


def dropped_out(attention_BxHxQxK, rng, rate: float):
  """Attention probabilities dropped out, each entry kept or dropped as the flash kernel keeps or
  drops it (`kernels.dropout.keep_mask` of a seed from `rng`), so a run drops the same entries on
  every platform and path. On a CPU this hash costs a twentieth of `jax.random.bernoulli`'s
  threefry bits (1.4 ms against 32 ms for [16, 12, 128, 128]), 9 % of the 3x384 student's step."""
  batch, heads, queries, keys = attention_BxHxQxK.shape
  keep = dropout_bits.keep_mask(dropout_bits.seed_from_key(rng), batch, heads, queries, rate, keys)
  scaled = attention_BxHxQxK * jnp.asarray(dropout_bits.scale(rate), attention_BxHxQxK.dtype)
  return jax.lax.select(keep, scaled, jnp.zeros_like(attention_BxHxQxK))


def scores(q_BxLxHxK, k_BxLxHxK, mask, terms: ScoreTerms):
  """[B, H, Lq, Lk] float32 attention scores over their divisor, biased, masked and windowed (`terms`)."""
  scale = jnp.sqrt(q_BxLxHxK.shape[-1]).astype(jnp.float32) if terms.scale is None else jnp.float32(terms.scale)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32) / scale
  if terms.bias is not None:
    scores = scores + terms.bias
  return jnp.where(_visible(mask, terms.window), scores, MASK_VALUE)


def attention_with_dropout(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, rng, rate: float, terms: ScoreTerms):
  """Context [B, L, H, K] of attention whose probabilities are dropped out (`dropped_out`). On
  accelerators, where a shape does not suit our kernel (`kernels.attention.supported`), its
  layer's backward pass recomputes the [B, H, L, L] scores, probabilities and mask
  (`_RematerialisedLayer`)."""
  attention = jax.nn.softmax(scores(q_BxLxHxK, k_BxLxHxK, mask, terms), axis=-1)
  probs = dropped_out(attention, rng, rate)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v_BxLxHxK.dtype), v_BxLxHxK)
