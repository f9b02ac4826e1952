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
from jax.experimental import pallas as pl

from minilm_jax.kernels import dropout
from minilm_jax.kernels.platform import call, out_shape

# Added to the scores of padding keys: the encoder's value (models.encoder.MASK_VALUE).
MASK_VALUE = -1e9
# Names the compiled program carries (aot.report counts their bytes and FLOPs by them).
FORWARD, BACKWARD = "minilm_flash_fwd", "minilm_flash_bwd"


def _product_flops(operand_dims: list) -> int:
  """One [L, L] x K product of every (example, head): 2 B H L^2 K, from the queries (the kernels'
  third operand, B H L K elements in either layout) and the key mask's length (the second)."""
  return 2 * math.prod(operand_dims[2]) * operand_dims[1][-1]


# Matrix products each kernel computes: the forward's scores and weighted sum; the backward's scores
# recomputed, then the gradients of the probabilities, values, queries and keys.
FLOPS = {FORWARD: lambda dims: 2 * _product_flops(dims), BACKWARD: lambda dims: 5 * _product_flops(dims)}
_NT = (((1,), (1,)), ((), ()))  # A B^T
_TN = (((0,), (0,)), ((), ()))  # A^T B
_NN = (((1,), (0,)), ((), ()))  # A B


def block_size(length: int) -> int:
  """Query and key block: 128 rows (Triton's and Mosaic's tiles take it), or the whole length."""
  return 128 if length % 128 == 0 else length


def supported(length: int, head_dim: int) -> bool:
  """Shapes the kernels take: power-of-two blocks of at least 16 rows and a head size of 16 to 256,
  a multiple of 8 (Triton's matrix products want every side at least 16)."""
  block = block_size(length)
  return block >= 16 and block & (block - 1) == 0 and head_dim % 8 == 0 and 16 <= head_dim <= 256


def _dot(a, b, dims):
  return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _scores(q, k, key_mask, scale):
  """Scaled scores of a [bq, K] x [bk, K] block, padding keys at MASK_VALUE (float32)."""
  s = _dot(q, k, _NT) * scale
  return jnp.where(key_mask > 0, s, MASK_VALUE)


def _keep(seed, row_head, q_start, k_start, shape, length, rate):
  rows = q_start + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
  cols = k_start + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
  return dropout.keep_block(seed, row_head, rows, cols, length, rate)


def _forward_kernel(seed_ref, mask_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, heads, length, block, rate):
  b, h, qi = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  seed, row_head = seed_ref[...], b * heads + h
  q = q_ref[...]
  scale = 1.0 / math.sqrt(q.shape[-1])

  def body(j, carry):
    acc, m, l = carry
    start = pl.multiple_of(j * block, block)
    k, v = k_ref[pl.ds(start, block), :], v_ref[pl.ds(start, block), :]
    s = _scores(q, k, mask_ref[:, pl.ds(start, block)], scale)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m - m_new)
    l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
    if rate > 0:
      keep = _keep(seed, row_head, qi * block, start, p.shape, length, rate)
      p = jnp.where(keep, p * (1.0 / (1.0 - rate)), 0.0)
    acc = alpha * acc + _dot(p.astype(v.dtype), v, _NN)
    return acc, m_new, l

  init = (
    jnp.zeros(q.shape, jnp.float32),
    jnp.full((q.shape[0], 1), -jnp.inf, jnp.float32),
    jnp.zeros((q.shape[0], 1), jnp.float32),
  )
  acc, m, l = jax.lax.fori_loop(0, length // block, body, init)
  o_ref[...] = (acc / l).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log(l)


def _backward_kernel(seed_ref, mask_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, d_ref, dq_ref, dk_ref, dv_ref, **kw):
  """Gradients of one (example, head), the whole [L, L] a block at a time: keys' and values' in
  the outer loop's carry, queries' accumulated in float32 in `dq_ref` (this program's own block),
  so each block's scores and probabilities are recomputed once, as the backward pass needs them."""
  heads, length, block, rate = kw["heads"], kw["length"], kw["block"], kw["rate"]
  b, h = pl.program_id(0), pl.program_id(1)
  seed, row_head = seed_ref[...], b * heads + h
  scale = 1.0 / math.sqrt(q_ref.shape[-1])
  dq_ref[...] = jnp.zeros(dq_ref.shape, dq_ref.dtype)

  def over_keys(j, _):
    key_start = pl.multiple_of(j * block, block)
    keys = pl.ds(key_start, block)
    k, v, key_mask = k_ref[keys, :], v_ref[keys, :], mask_ref[:, keys]

    def over_queries(i, carry):
      dk, dv = carry
      query_start = pl.multiple_of(i * block, block)
      rows = pl.ds(query_start, block)
      q, do = q_ref[rows, :], do_ref[rows, :]
      p = jnp.exp(_scores(q, k, key_mask, scale) - lse_ref[rows, :])
      dp = _dot(do, v, _NT)
      if rate > 0:
        z = jnp.where(_keep(seed, row_head, query_start, key_start, p.shape, length, rate), 1.0 / (1.0 - rate), 0.0)
        dv = dv + _dot((p * z).astype(do.dtype), do, _TN)
        dp = dp * z
      else:
        dv = dv + _dot(p.astype(do.dtype), do, _TN)
      ds = p * (dp - d_ref[rows, :])
      dq_ref[rows, :] += _dot(ds.astype(k.dtype), k, _NN)
      return dk + _dot(ds.astype(q.dtype), q, _TN), dv

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, length // block, over_queries, (zeros, zeros))
    dk_ref[keys, :] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[keys, :] = dv.astype(dv_ref.dtype)
    return 0

  jax.lax.fori_loop(0, length // block, over_keys, 0)
  dq_ref[...] = dq_ref[...] * scale


class _Layout:
  """Where batch, length and head sit in the kernels' [.., .., .., K] operands, and the BlockSpecs
  that take one (example, head)'s rows from them: the encoder's own [B, L, H, K] on GPUs (Triton
  loads a strided block as it loads a dense one, so no transpose reaches HBM), [B, H, L, K] on
  TPUs (Mosaic tiles the last two dimensions, which must then be length and head size). Row
  statistics (log-sum-exps, rowsum(dO * O)) have the same layout with a last dimension of 1."""

  def __init__(self, platform: str):
    self.heads_first = platform == "tpu"

  def shape(self, batch, heads, length, dim):
    return (batch, heads, length, dim) if self.heads_first else (batch, length, heads, dim)

  def dims(self, x):
    """(batch, heads, length, head size) of an operand."""
    b, second, third, dim = x.shape
    return (b, second, third, dim) if self.heads_first else (b, third, second, dim)

  def rows(self, count: int, dim: int, blocked: bool):
    """`count` rows of one (example, head): the grid's third index's block, or all of them."""

    def index(b, h, *i):
      row = i[0] if blocked else 0
      return (b, h, row, 0) if self.heads_first else (b, row, h, 0)

    block = (None, None, count, dim) if self.heads_first else (None, count, None, dim)
    return pl.BlockSpec(block, index)


def _forward(q, k, v, key_mask, seed, rate, platform):
  layout = _Layout(platform)
  batch, heads, length, dim = layout.dims(q)
  block = block_size(length)
  kernel = functools.partial(_forward_kernel, heads=heads, length=length, block=block, rate=rate)
  return call(
    kernel,
    platform,
    FORWARD,
    grid=(batch, heads, length // block),
    in_specs=[
      pl.BlockSpec((1, 1), lambda b, h, i: (0, 0)),
      pl.BlockSpec((None, 1, length), lambda b, h, i: (b, 0, 0)),
      layout.rows(block, dim, blocked=True),
      layout.rows(length, dim, blocked=False),
      layout.rows(length, dim, blocked=False),
    ],
    out_specs=[layout.rows(block, dim, blocked=True), layout.rows(block, 1, blocked=True)],
    out_shape=[
      out_shape(q.shape, q.dtype, q),
      out_shape(layout.shape(batch, heads, length, 1), jnp.float32, q),
    ],
  )(seed, key_mask, q, k, v)


def _backward(rate, platform, residuals, do):
  seed, key_mask, q, k, v, o, lse = residuals
  layout = _Layout(platform)
  batch, heads, length, dim = layout.dims(q)
  block = block_size(length)
  d = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
  whole, row_stat = layout.rows(length, dim, blocked=False), layout.rows(length, 1, blocked=False)
  kernel = functools.partial(_backward_kernel, heads=heads, length=length, block=block, rate=rate)
  dq, dk, dv = call(
    kernel,
    platform,
    BACKWARD,
    grid=(batch, heads),
    in_specs=[
      pl.BlockSpec((1, 1), lambda b, h: (0, 0)),
      pl.BlockSpec((None, 1, length), lambda b, h: (b, 0, 0)),
      whole,
      whole,
      whole,
      whole,
      row_stat,
      row_stat,
    ],
    out_specs=[whole, whole, whole],
    out_shape=[out_shape(q.shape, jnp.float32, q), out_shape(k.shape, k.dtype, q), out_shape(v.shape, v.dtype, q)],
  )(seed, key_mask, q, k, v, do, lse, d)
  return None, None, dq.astype(q.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(seed, key_mask, q, k, v, rate, platform):
  return _forward(q, k, v, key_mask, seed, rate, platform)[0]


def _flash_fwd(seed, key_mask, q, k, v, rate, platform):
  o, lse = _forward(q, k, v, key_mask, seed, rate, platform)
  return o, (seed, key_mask, q, k, v, o, lse)


_flash.defvjp(_flash_fwd, _backward)


def flash_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, seed, rate: float, platform: str):
  """Context [B, L, H, K] (the encoder's layout) of attention whose probabilities are dropped out
  at `rate` by `dropout.keep_mask(seed, ...)`, under a [B, L] key padding mask; differentiable in
  q, k, v. `platform` picks the lowering (Triton on GPUs, Mosaic on TPUs, interpreted on CPUs)."""
  seed_1x1 = jnp.reshape(jnp.asarray(seed, jnp.int32), (1, 1))
  key_mask = key_mask_BxL.astype(jnp.int32)[:, None, :]
  if not _Layout(platform).heads_first:
    return _flash(seed_1x1, key_mask, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, float(rate), platform)
  swap = lambda t: t.transpose(0, 2, 1, 3)  # [B, L, H, K] <-> [B, H, L, K]
  return swap(_flash(seed_1x1, key_mask, swap(q_BxLxHxK), swap(k_BxLxHxK), swap(v_BxLxHxK), float(rate), platform))


def reference(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, seed, rate: float):
  """The explicit computation the kernels equal: full [B, H, L, L] scores, softmax, the same mask."""
  batch, length, heads, dim = q_BxLxHxK.shape
  s = jnp.einsum("bqhd,bkhd->bhqk", q_BxLxHxK, k_BxLxHxK, preferred_element_type=jnp.float32) / math.sqrt(dim)
  s = jnp.where(key_mask_BxL[:, None, None, :].astype(bool), s, MASK_VALUE)
  p = jax.nn.softmax(s, axis=-1)
  if rate > 0:
    p = jnp.where(dropout.keep_mask(seed, batch, heads, length, rate), p / (1.0 - rate), 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v_BxLxHxK.dtype), v_BxLxHxK, preferred_element_type=jnp.float32)
