"""MiniLM's relation KL, fused: KL(teacher relation || student relation) of every query row without
writing either [B, A_r, L, L] relation to HBM.

A relation is softmax(X Y^T / sqrt(d)) per relation head, padding keys at MASK_VALUE (as
`transfer.relations`). Each program takes a block of query rows of one (example, relation head), walks
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

from minilm_jax.kernels import costs
from minilm_jax.kernels.attention import MASK_VALUE
from minilm_jax.kernels.layout import Layout, block_rows, for_platform, key_mask_column, key_mask_spec, stat_spec
from minilm_jax.kernels.platform import Tiling, call, out_shape, tiling_for

FORWARD, BACKWARD = costs.RELATION_KL_FORWARD, costs.RELATION_KL_BACKWARD  # named in the compiled program
_NT = (((1,), (1,)), ((), ()))
_NN = (((1,), (0,)), ((), ()))
_TN = (((0,), (0,)), ((), ()))


def _dot(a, b, dims):
  """float32 products of float32 inputs at full precision (as the explicit path's); bfloat16
  inputs' products are exact in float32 already (and Mosaic takes no fp32 precision for them)."""
  precision = jax.lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _logits(yT, xT, key_column):
  """Scaled relation logits [keys, queries] of [d, keys] and [d, queries] blocks, padding keys at MASK_VALUE."""
  return jnp.where(key_column > 0, _dot(yT, xT, _TN) * (1.0 / math.sqrt(xT.shape[0])), MASK_VALUE)


def _forward_kernel(mask_ref, tx_ref, ty_ref, sx_ref, sy_ref, kl_ref, lse_t_ref, lse_s_ref, *, layout, length, block):
  txT, sxT = layout.load(tx_ref), layout.load(sx_ref)

  def body(j, carry):
    m_t, l_t, acc, m_s, l_s = carry
    keys = block_rows(j, block)
    key_column = mask_ref[keys, :]
    t = _logits(layout.load(ty_ref, keys), txT, key_column)
    s = _logits(layout.load(sy_ref, keys), sxT, key_column)
    m_t_new = jnp.maximum(m_t, jnp.max(t, axis=0, keepdims=True))
    alpha = jnp.exp(m_t - m_t_new)
    e_t = jnp.exp(t - m_t_new)
    l_t = alpha * l_t + jnp.sum(e_t, axis=0, keepdims=True)
    acc = alpha * acc + jnp.sum(e_t * (t - s), axis=0, keepdims=True)
    m_s_new = jnp.maximum(m_s, jnp.max(s, axis=0, keepdims=True))
    l_s = jnp.exp(m_s - m_s_new) * l_s + jnp.sum(jnp.exp(s - m_s_new), axis=0, keepdims=True)
    return m_t_new, l_t, acc, m_s_new, l_s

  row = (1, txT.shape[1])
  low, zero = jnp.full(row, -jnp.inf, jnp.float32), jnp.zeros(row, jnp.float32)
  m_t, l_t, acc, m_s, l_s = jax.lax.fori_loop(0, length // block, body, (low, zero, zero, low, zero))
  lse_t, lse_s = m_t + jnp.log(l_t), m_s + jnp.log(l_s)
  kl_ref[...] = acc / l_t - lse_t + lse_s
  lse_t_ref[...] = lse_t
  lse_s_ref[...] = lse_s


def _backward_kernel(mask_ref, tx_ref, ty_ref, sx_ref, sy_ref, lse_t_ref, lse_s_ref, g_ref, dsx_ref, dsy_ref, **kw):
  """The student's gradients of one (example, relation head), the whole [L, L] a block at a time:
  the keys' side in the outer loop's carry, the queries' accumulated in float32 in `dsx_ref`
  (this program's own block), so each block's logits are recomputed once."""
  layout, length, block = kw["layout"], kw["length"], kw["block"]
  layout.zero(dsx_ref, length, block)

  def over_keys(j, _):
    keys = block_rows(j, block)
    tyT, syT, key_column = layout.load(ty_ref, keys), layout.load(sy_ref, keys), mask_ref[keys, :]
    scale = 1.0 / math.sqrt(syT.shape[0])

    def over_queries(i, dsyT):
      rows = block_rows(i, block)
      sxT = layout.load(sx_ref, rows)
      p_t = jnp.exp(_logits(tyT, layout.load(tx_ref, rows), key_column) - lse_t_ref[:, rows])
      p_s = jnp.exp(_logits(syT, sxT, key_column) - lse_s_ref[:, rows])
      # dKL/ds at real keys, times the rows' cotangents: g (p_s - p_t), as [keys, queries].
      ds = jnp.where(key_column > 0, g_ref[:, rows] * (p_s - p_t), 0.0).astype(sxT.dtype)
      layout.add(dsx_ref, _dot(syT, ds, _NN) * scale, rows)
      return dsyT + _dot(sxT, ds, _NT)

    dsyT = jax.lax.fori_loop(0, length // block, over_queries, jnp.zeros(syT.shape, jnp.float32))
    layout.store(dsy_ref, dsyT * scale, keys)
    return 0

  jax.lax.fori_loop(0, length // block, over_keys, 0)


def _forward(key_mask, tx, ty, sx, sy, platform, layout, tiling):
  batch, heads, length, d_t = layout.dims(tx)
  d_s = layout.dims(sx)[3]
  tiling = tiling or tiling_for(platform, FORWARD, (d_t, d_s), length)
  block = tiling.block_for(length)
  row = out_shape((batch, heads, 1, length), jnp.float32, sx)
  return call(
    functools.partial(_forward_kernel, layout=layout, length=length, block=block),
    platform,
    FORWARD,
    tiling,
    grid=(batch, heads, length // block),
    in_specs=[
      key_mask_spec(length),
      layout.spec(block, d_t, blocked=True),
      layout.spec(length, d_t, blocked=False),
      layout.spec(block, d_s, blocked=True),
      layout.spec(length, d_s, blocked=False),
    ],
    out_specs=[stat_spec(block, blocked=True)] * 3,
    out_shape=[row] * 3,
  )(key_mask, tx, ty, sx, sy)


def _backward(platform, layout, tiling, residuals, g):
  key_mask, tx, ty, sx, sy, lse_t, lse_s = residuals
  batch, heads, length, d_t = layout.dims(tx)
  d_s = layout.dims(sx)[3]
  tiling = tiling or tiling_for(platform, BACKWARD, (d_t, d_s), length)
  teacher, student = layout.spec(length, d_t, blocked=False), layout.spec(length, d_s, blocked=False)
  stat = stat_spec(length, blocked=False)
  dsx, dsy = call(
    functools.partial(_backward_kernel, layout=layout, length=length, block=tiling.block_for(length)),
    platform,
    BACKWARD,
    tiling,
    grid=(batch, heads),
    in_specs=[key_mask_spec(length), teacher, teacher, student, student, stat, stat, stat],
    out_specs=[student, student],
    out_shape=[out_shape(sx.shape, jnp.float32, sx), out_shape(sy.shape, sy.dtype, sx)],
  )(key_mask, tx, ty, sx, sy, lse_t, lse_s, g[0])  # g[0]: the row KLs' cotangent (no one differentiates the lses)
  return None, None, None, dsx.astype(sx.dtype), dsy


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _relation_kl(key_mask, tx, ty, sx, sy, platform, layout, tiling):
  return _forward(key_mask, tx, ty, sx, sy, platform, layout, tiling)


def _relation_kl_fwd(key_mask, tx, ty, sx, sy, platform, layout, tiling):
  kl, lse_t, lse_s = _forward(key_mask, tx, ty, sx, sy, platform, layout, tiling)
  return (kl, lse_t, lse_s), (key_mask, tx, ty, sx, sy, lse_t, lse_s)


_relation_kl.defvjp(_relation_kl_fwd, _backward)


def relation_kl_rows(
  teacher_xy, student_xy, key_mask_BxL, platform: str, layout: Layout | None = None, tiling: Tiling | None = None
):
  """KL(teacher || student) of every query row of the relations softmax(X Y^T / sqrt(d)):
  [B, A_r, L], float32. `teacher_xy`, `student_xy`: pairs of [B, A_r, L, d] projections already
  split into relation heads (teacher and student widths may differ). Differentiable in the
  student's pair only. `platform` picks the lowering and the memory layout the kernels read
  (`layout.for_platform`; `layout` overrides it, as the tests do to run the TPU's interpreted) and
  the blocks (`platform.tiling_for`: the tuned table's or the platform's; `tiling` overrides them)."""
  layout = layout or for_platform(platform, "bhlk")
  teacher_xy = jax.lax.stop_gradient(teacher_xy)
  tx, ty, sx, sy = (layout.to("bhlk", z) for z in (*teacher_xy, *student_xy))
  kl, _, _ = _relation_kl(key_mask_column(key_mask_BxL), tx, ty, sx, sy, platform, layout, tiling)
  return kl[:, :, 0, :]
