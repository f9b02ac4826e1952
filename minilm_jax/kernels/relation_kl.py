"""MiniLM's relation KL, fused: KL(teacher relation || student relation) of every query row without
writing either [B, A_r, L, L] relation to HBM.

A relation is softmax(X Y^T / sqrt(d)) per relation head, padding keys at MASK_VALUE (as
`distill.losses`). Each program takes a block of query rows of one (example, relation head), walks
the keys a block at a time and keeps, per row, both models' running maximum and sum of exponentials
(an online log-sum-exp) and the teacher-weighted sum of the logit difference:

  KL_row = sum_k p_t (t_k - s_k) - lse_t + lse_s,   p_t = exp(t - lse_t)

(the terms of padding keys are exactly 0, as the explicit path's `where(p_t > 0, ...)` makes
them). The forward pass keeps each row's two log-sum-exps; the backward pass recomputes the blocks
and gives the student's gradients only (the teacher is under `stop_gradient`): with g the row's
cotangent, dS = g (p_s - p_t) over real keys; dX_s = dS Y_s / sqrt(d_s), dY_s = dS^T X_s / sqrt(d_s),
one program per (example, relation head) walking all its blocks, so that none needs atomic adds.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from minilm_jax.kernels.attention import MASK_VALUE, block_size
from minilm_jax.kernels.platform import call, out_shape

FORWARD, BACKWARD = "minilm_relation_kl_fwd", "minilm_relation_kl_bwd"


def _logit_flops(operand_dims: list) -> tuple:
  """(teacher, student) relation-logit products, 2 B A L^2 d each, from the operands (key mask,
  teacher x, teacher y, student x, student y, ...)."""
  (b, a, length, d_t), (_, _, _, d_s) = operand_dims[1], operand_dims[3]
  return 2 * b * a * length * length * d_t, 2 * b * a * length * length * d_s


# Matrix products each kernel computes: the forward's two logits; the backward's two logits
# recomputed and the student's two gradients.
FLOPS = {
  FORWARD: lambda dims: sum(_logit_flops(dims)),
  BACKWARD: lambda dims: _logit_flops(dims)[0] + 3 * _logit_flops(dims)[1],
}
_NT = (((1,), (1,)), ((), ()))
_NN = (((1,), (0,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))


def _dot(a, b, dims):
  """float32 products of float32 inputs at full precision (as the explicit path's); bfloat16
  inputs' products are exact in float32 already (and Mosaic takes no fp32 precision for them)."""
  precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _logits(x, y, key_mask):
  s = _dot(x, y, _NT) * (1.0 / math.sqrt(x.shape[-1]))
  return jnp.where(key_mask > 0, s, MASK_VALUE)


def _forward_kernel(mask_ref, tx_ref, ty_ref, sx_ref, sy_ref, kl_ref, lse_t_ref, lse_s_ref, *, length, block):
  tx, sx = tx_ref[...], sx_ref[...]

  def body(j, carry):
    m_t, l_t, acc, m_s, l_s = carry
    start = pl.multiple_of(j * block, block)
    key_mask = mask_ref[:, pl.ds(start, block)]
    t = _logits(tx, ty_ref[pl.ds(start, block), :], key_mask)
    s = _logits(sx, sy_ref[pl.ds(start, block), :], key_mask)
    m_t_new = jnp.maximum(m_t, jnp.max(t, axis=1, keepdims=True))
    alpha = jnp.exp(m_t - m_t_new)
    e_t = jnp.exp(t - m_t_new)
    l_t = alpha * l_t + jnp.sum(e_t, axis=1, keepdims=True)
    acc = alpha * acc + jnp.sum(e_t * (t - s), axis=1, keepdims=True)
    m_s_new = jnp.maximum(m_s, jnp.max(s, axis=1, keepdims=True))
    l_s = jnp.exp(m_s - m_s_new) * l_s + jnp.sum(jnp.exp(s - m_s_new), axis=1, keepdims=True)
    return m_t_new, l_t, acc, m_s_new, l_s

  rows = (tx.shape[0], 1)
  low, zero = jnp.full(rows, -jnp.inf, jnp.float32), jnp.zeros(rows, jnp.float32)
  m_t, l_t, acc, m_s, l_s = jax.lax.fori_loop(0, length // block, body, (low, zero, zero, low, zero))
  lse_t, lse_s = m_t + jnp.log(l_t), m_s + jnp.log(l_s)
  kl_ref[...] = acc / l_t - lse_t + lse_s
  lse_t_ref[...] = lse_t
  lse_s_ref[...] = lse_s


def _grad_logits(tx, ty, sx, sy, key_mask, lse_t, lse_s, g):
  """dKL/ds of a block, times the rows' cotangents: g (p_s - p_t) at real keys."""
  p_t = jnp.exp(_logits(tx, ty, key_mask) - lse_t)
  p_s = jnp.exp(_logits(sx, sy, key_mask) - lse_s)
  return jnp.where(key_mask > 0, g * (p_s - p_t), 0.0)


def _backward_kernel(
  mask_ref, tx_ref, ty_ref, sx_ref, sy_ref, lse_t_ref, lse_s_ref, g_ref, dsx_ref, dsy_ref, *, length, block
):
  """The student's gradients of one (example, relation head), the whole [L, L] a block at a time:
  the keys' side in the outer loop's carry, the queries' accumulated in float32 in `dsx_ref`
  (this program's own block), so each block's logits are recomputed once."""
  dsx_ref[...] = jnp.zeros(dsx_ref.shape, dsx_ref.dtype)

  def over_keys(j, _):
    keys = pl.ds(pl.multiple_of(j * block, block), block)
    ty, sy, key_mask = ty_ref[keys, :], sy_ref[keys, :], mask_ref[:, keys]

    def over_queries(i, dsy):
      rows = pl.ds(pl.multiple_of(i * block, block), block)
      sx = sx_ref[rows, :]
      ds = _grad_logits(tx_ref[rows, :], ty, sx, sy, key_mask, lse_t_ref[rows, :], lse_s_ref[rows, :], g_ref[rows, :])
      dsx_ref[rows, :] += _dot(ds.astype(sy.dtype), sy, _NN)
      return dsy + _dot(ds.astype(sx.dtype), sx, _TN)

    dsy = jax.lax.fori_loop(0, length // block, over_queries, jnp.zeros(sy.shape, jnp.float32))
    dsy_ref[keys, :] = (dsy * (1.0 / math.sqrt(sy.shape[-1]))).astype(dsy_ref.dtype)
    return 0

  jax.lax.fori_loop(0, length // block, over_keys, 0)
  dsx_ref[...] = dsx_ref[...] * (1.0 / math.sqrt(sx_ref.shape[-1]))


def _forward(key_mask, tx, ty, sx, sy, platform):
  batch, heads, length, _ = tx.shape
  block = block_size(length)

  def query_block(dim):
    return pl.BlockSpec((None, None, block, dim), lambda b, a, i: (b, a, i, 0))

  def whole(dim):
    return pl.BlockSpec((None, None, length, dim), lambda b, a, i: (b, a, 0, 0))

  row = out_shape((batch, heads, length, 1), jnp.float32, sx)
  return call(
    functools.partial(_forward_kernel, length=length, block=block),
    platform,
    FORWARD,
    grid=(batch, heads, length // block),
    in_specs=[
      pl.BlockSpec((None, 1, length), lambda b, a, i: (b, 0, 0)),
      query_block(tx.shape[-1]),
      whole(tx.shape[-1]),
      query_block(sx.shape[-1]),
      whole(sx.shape[-1]),
    ],
    out_specs=[query_block(1)] * 3,
    out_shape=[row] * 3,
  )(key_mask, tx, ty, sx, sy)


def _backward(platform, residuals, g):
  key_mask, tx, ty, sx, sy, lse_t, lse_s = residuals
  batch, heads, length, _ = tx.shape

  def whole(dim):
    return pl.BlockSpec((None, None, length, dim), lambda b, a: (b, a, 0, 0))

  dsx, dsy = call(
    functools.partial(_backward_kernel, length=length, block=block_size(length)),
    platform,
    BACKWARD,
    grid=(batch, heads),
    in_specs=[
      pl.BlockSpec((None, 1, length), lambda b, a: (b, 0, 0)),
      *[whole(z.shape[-1]) for z in (tx, ty, sx, sy)],
      *[whole(1)] * 3,
    ],
    out_specs=[whole(sx.shape[-1]), whole(sy.shape[-1])],
    out_shape=[out_shape(sx.shape, jnp.float32, sx), out_shape(sy.shape, sy.dtype, sx)],
  )(key_mask, tx, ty, sx, sy, lse_t, lse_s, g[0])  # g[0]: the row KLs' cotangent (no one differentiates the lses)
  return None, None, None, dsx.astype(sx.dtype), dsy


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _relation_kl(key_mask, tx, ty, sx, sy, platform):
  return _forward(key_mask, tx, ty, sx, sy, platform)


def _relation_kl_fwd(key_mask, tx, ty, sx, sy, platform):
  kl, lse_t, lse_s = _forward(key_mask, tx, ty, sx, sy, platform)
  return (kl, lse_t, lse_s), (key_mask, tx, ty, sx, sy, lse_t, lse_s)


_relation_kl.defvjp(_relation_kl_fwd, _backward)


def relation_kl_rows(teacher_xy, student_xy, key_mask_BxL, platform: str):
  """KL(teacher || student) of every query row of the relations softmax(X Y^T / sqrt(d)):
  [B, A_r, L], float32. `teacher_xy`, `student_xy`: pairs of [B, A_r, L, d] projections already
  split into relation heads (teacher and student widths may differ). Differentiable in the
  student's pair only."""
  key_mask = key_mask_BxL.astype(jnp.int32)[:, None, :]
  teacher_xy = jax.lax.stop_gradient(teacher_xy)
  kl, _, _ = _relation_kl(key_mask, *teacher_xy, *student_xy, platform)
  return kl[..., 0]
