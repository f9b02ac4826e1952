"""The students' self-attention with dropout on its probabilities, flash-style (forward and backward).

`flash_attention(q, k, v, key_mask, seed, rate, platform)` ([B, L, H, K] in and out) equals the explicit
`dropout(softmax(Q K^T / sqrt(d) masked)) V` whose dropout keeps `dropout.keep_mask(seed, ...)`,
with the same large finite `MASK_VALUE` for padding keys (a row whose keys are all padding is
uniform, as the explicit path makes it). No [B, H, L, L] tensor is written to HBM: each program
holds a block of query rows, walks the keys a block at a time under an online softmax (FlashAttention,
Dao et al. 2022) and makes each block's dropout mask from the seed. The forward pass keeps only the
output and each row's log-sum-exp; the backward pass recomputes each block's probabilities from
them once, one program per (example, head) walking all [L, L] blocks (queries' gradients
accumulated in its own float32 output block), so no kernel needs atomic adds and both lower to
Triton and Mosaic alike.

Dropout in the backward pass, with P the probabilities, Z the scaled keep mask and O = (P * Z) V:
dV = (P * Z)^T dO; dP = (dO V^T) * Z; dS = P * (dP - D) with D = rowsum(dO * O) (which equals
rowsum(dP * P), dropout included); dQ = dS K / sqrt(d); dK = dS^T Q / sqrt(d).
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.experimental import pallas as pl

from minilm_jax.kernels import costs, dropout
from minilm_jax.kernels.layout import Layout, block_rows, for_platform, key_mask_column, key_mask_spec, stat_spec
from minilm_jax.kernels.platform import Tiling, call, out_shape, tiling_for

# Added to the attention scores of padding keys, here and on the explicit paths. Finite on
# purpose: a row whose keys are all masked then gets a uniform distribution instead of NaN.
MASK_VALUE = -1e9
# The name the forward kernel's output and log-sum-exp carry as residuals: a rematerialised caller
# whose policy saves it (`jax.checkpoint_policies.save_only_these_names`) keeps them rather than
# running the forward kernel again in the backward pass.
RESIDUALS = "flash_attention_residuals"
# Names the compiled program carries (aot.report counts their bytes and FLOPs by them, `costs.FLOPS`).
FORWARD, BACKWARD = costs.ATTENTION_FORWARD, costs.ATTENTION_BACKWARD
_NT = (((1,), (1,)), ((), ()))  # A B^T
_TN = (((0,), (0,)), ((), ()))  # A^T B
_NN = (((1,), (0,)), ((), ()))  # A B


def supported(length: int, head_dim: int, platform: str, tiling: Tiling | None = None) -> bool:
  """Shapes the kernels take on `platform` (in its blocks, or `tiling`'s): power-of-two blocks of
  at least 16 rows and a head size of 16 to 256, a multiple of 8 (Triton's matrix products want
  every side at least 16)."""
  block = (tiling or tiling_for(platform)).block_for(length)
  return block >= 16 and block & (block - 1) == 0 and head_dim % 8 == 0 and 16 <= head_dim <= 256


def _dot(a, b, dims):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _scores(kT, qT, key_column, scale):
  """Scaled scores [keys, queries] of [K, keys] and [K, queries] blocks, padding keys at MASK_VALUE."""
  return jnp.where(key_column > 0, _dot(kT, qT, _TN) * scale, MASK_VALUE)


def _keep(base, key_start, query_start, shape, length, rate):
  """The dropout mask's [keys, queries] block (`dropout.keep_mask` by query, then key), from the
  (row, head)'s hash state `base`: a word hashed once for four neighbouring keys, or each entry on
  its own where the block is a whole length that is not a multiple of four."""
  keys, queries = shape
  if keys % dropout.ENTRIES_PER_WORD:
    key_ids = key_start + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    query_ids = query_start + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return dropout.entry_keeps(base, query_ids, key_ids, length, rate)
  word_shape = (keys // dropout.ENTRIES_PER_WORD, queries)
  word_ids = dropout.word_of(key_start) + jax.lax.broadcasted_iota(jnp.int32, word_shape, 0)
  query_ids = query_start + jax.lax.broadcasted_iota(jnp.int32, word_shape, 1)
  return dropout.spread_keeps(dropout.words(base, query_ids, word_ids, dropout.words_per_row(length)), 0, rate)


def _forward_kernel(seed_ref, mask_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, layout, heads, length, block, rate):
  b, h, qi = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  base = dropout.row_base(seed_ref[...], b * heads + h)
  qT = layout.load(q_ref)
  scale = 1.0 / math.sqrt(qT.shape[0])

  def body(j, carry):
    accT, m, l = carry
    keys = block_rows(j, block)
    kT, vT = layout.load(k_ref, keys), layout.load(v_ref, keys)
    sT = _scores(kT, qT, mask_ref[keys, :], scale)
    m_new = jnp.maximum(m, jnp.max(sT, axis=0, keepdims=True))
    p = jnp.exp(sT - m_new)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(p, axis=0, keepdims=True)
    if rate > 0:
      keep = _keep(base, j * block, qi * block, p.shape, length, rate)
      p = jnp.where(keep, p * dropout.scale(rate), 0.0)
    return alpha * accT + _dot(vT, p.astype(vT.dtype), _NN), m_new, l

  row = (1, qT.shape[1])
  init = (jnp.zeros(qT.shape, jnp.float32), jnp.full(row, -jnp.inf, jnp.float32), jnp.zeros(row, jnp.float32))
  accT, m, l = jax.lax.fori_loop(0, length // block, body, init)
  layout.store(o_ref, accT / l)
  lse_ref[...] = m + jnp.log(l)


def _backward_kernel(seed_ref, mask_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref, dq_ref, dk_ref, dv_ref, **kw):
  """Gradients of one (example, head), the whole [L, L] a block at a time: keys' and values' in
  the outer loop's carry, queries' accumulated in float32 in `dq_ref` (this program's own block),
  so each block's scores and probabilities are recomputed once, as the backward pass needs them."""
  layout, heads, length, block, rate = kw["layout"], kw["heads"], kw["length"], kw["block"], kw["rate"]
  b, h = pl.program_id(0), pl.program_id(1)
  base = dropout.row_base(seed_ref[...], b * heads + h)
  layout.zero(dq_ref, length, block)

  def over_keys(j, _):
    keys = block_rows(j, block)
    kT, vT, key_column = layout.load(k_ref, keys), layout.load(v_ref, keys), mask_ref[keys, :]
    scale = 1.0 / math.sqrt(kT.shape[0])

    def over_queries(i, carry):
      dkT, dvT = carry
      rows = block_rows(i, block)
      qT, doT = layout.load(q_ref, rows), layout.load(do_ref, rows)
      p = jnp.exp(_scores(kT, qT, key_column, scale) - lse_ref[:, rows])
      dp = _dot(vT, doT, _TN)
      if rate > 0:
        z = jnp.where(_keep(base, j * block, i * block, p.shape, length, rate), dropout.scale(rate), 0.0)
        dvT = dvT + _dot(doT, (p * z).astype(doT.dtype), _NT)
        dp = dp * z
      else:
        dvT = dvT + _dot(doT, p.astype(doT.dtype), _NT)
      ds = (p * (dp - d_ref[:, rows])).astype(qT.dtype)
      layout.add(dq_ref, _dot(kT, ds, _NN) * scale, rows)
      return dkT + _dot(qT, ds, _NT), dvT

    zeros = jnp.zeros(kT.shape, jnp.float32)
    dkT, dvT = jax.lax.fori_loop(0, length // block, over_queries, (zeros, zeros))
    layout.store(dk_ref, dkT * scale, keys)
    layout.store(dv_ref, dvT, keys)
    return 0

  jax.lax.fori_loop(0, length // block, over_keys, 0)


def _forward(q, k, v, key_mask, seed, rate, platform, layout, tiling):
  batch, heads, length, dim = layout.dims(q)
  tiling = tiling or tiling_for(platform, FORWARD, (dim,), length)
  block = tiling.block_for(length)
  kernel = functools.partial(_forward_kernel, layout=layout, heads=heads, length=length, block=block, rate=rate)
  return call(
    kernel,
    platform,
    FORWARD,
    tiling,
    grid=(batch, heads, length // block),
    in_specs=[
      pl.BlockSpec((1, 1), lambda b, h, i: (0, 0)),
      key_mask_spec(length),
      layout.spec(block, dim, blocked=True),
      layout.spec(length, dim, blocked=False),
      layout.spec(length, dim, blocked=False),
    ],
    out_specs=[layout.spec(block, dim, blocked=True), stat_spec(block, blocked=True)],
    out_shape=[out_shape(q.shape, q.dtype, q), out_shape((batch, heads, 1, length), jnp.float32, q)],
  )(seed, key_mask, q, k, v)


def _backward(rate, platform, layout, tiling, residuals, do):
  seed, key_mask, q, k, v, o, lse = residuals
  batch, heads, length, dim = layout.dims(q)
  tiling = tiling or tiling_for(platform, BACKWARD, (dim,), length)
  # D = rowsum(dO * O) per query, as a [B, H, 1, L] row like the log-sum-exps.
  d = jnp.sum(Layout("bhlk").to(layout.order, do.astype(jnp.float32) * o.astype(jnp.float32)), -1)[:, :, None, :]
  whole = layout.spec(length, dim, blocked=False)
  kernel = functools.partial(
    _backward_kernel, layout=layout, heads=heads, length=length, block=tiling.block_for(length), rate=rate
  )
  dq, dk, dv = call(
    kernel,
    platform,
    BACKWARD,
    tiling,
    grid=(batch, heads),
    in_specs=[
      pl.BlockSpec((1, 1), lambda b, h: (0, 0)),
      key_mask_spec(length),
      whole,
      whole,
      whole,
      whole,
      stat_spec(length, blocked=False),
      stat_spec(length, blocked=False),
    ],
    out_specs=[whole, whole, whole],
    out_shape=[out_shape(q.shape, jnp.float32, q), out_shape(k.shape, k.dtype, q), out_shape(v.shape, v.dtype, q)],
  )(seed, key_mask, q, k, v, do, lse, d)
  return None, None, dq.astype(q.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(seed, key_mask, q, k, v, rate, platform, layout, tiling):
  return _forward(q, k, v, key_mask, seed, rate, platform, layout, tiling)[0]


def _flash_fwd(seed, key_mask, q, k, v, rate, platform, layout, tiling):
  o, lse = _forward(q, k, v, key_mask, seed, rate, platform, layout, tiling)
  o_saved, lse_saved = (checkpoint_name(x, RESIDUALS) for x in (o, lse))
  return o, (seed, key_mask, q, k, v, o_saved, lse_saved)


_flash.defvjp(_flash_fwd, _backward)


def flash_attention(
  q_BxLxHxK,
  k_BxLxHxK,
  v_BxLxHxK,
  key_mask_BxL,
  seed,
  rate: float,
  platform: str,
  layout: Layout | None = None,
  tiling: Tiling | None = None,
):
  """Context [B, L, H, K] (the encoder's layout) of attention whose probabilities are dropped out
  at `rate` by `dropout.keep_mask(seed, ...)`, under a [B, L] key padding mask; differentiable in
  q, k, v. `platform` picks the lowering (Triton on GPUs, Mosaic on TPUs, interpreted on CPUs) and
  the memory layout the kernels read (`layout.for_platform`; `layout` overrides it, as the tests
  do to run the TPU's layout interpreted) and the blocks (`platform.tiling_for`: the tuned table's
  or the platform's, forward and backward each their own; `tiling` overrides both, as `bench
  kernels --tilings` does)."""
  layout = layout or for_platform(platform, "blhk")
  seed_1x1 = jnp.reshape(jnp.asarray(seed, jnp.int32), (1, 1))
  q, k, v = (layout.to("blhk", x) for x in (q_BxLxHxK, k_BxLxHxK, v_BxLxHxK))
  context = _flash(seed_1x1, key_mask_column(key_mask_BxL), q, k, v, float(rate), platform, layout, tiling)
  return Layout("blhk").to(layout.order, context)


def reference(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, seed, rate: float):
  """The explicit computation the kernels equal: full [B, H, L, L] scores, softmax, the same mask."""
  batch, length, heads, dim = q_BxLxHxK.shape
  s = jnp.einsum("bqhd,bkhd->bhqk", q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32) / math.sqrt(dim)
  s = jnp.where(key_mask_BxL[:, None, None, :].astype(bool), s, MASK_VALUE)
  p = jax.nn.softmax(s, axis=-1)
  if rate > 0:
    p = jnp.where(dropout.keep_mask(seed, batch, heads, length, rate), p * dropout.scale(rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v_BxLxHxK.dtype), v_BxLxHxK, preferred_element_type=jnp.float32)
