"""MiniLM objectives: self-attention relation transfer by KL divergence (MiniLM eqs. 6-10, MiniLMv2).

A *relation* between two of a layer's projections, say queries and keys, is
`softmax(X Y^T / sqrt(d_r))` per relation head. The projections of all attention heads are
concatenated to the hidden size and re-split into `A_r` relation heads of size
`d_r = hidden / A_r`, so teacher and student may differ in head count and width: every relation
is `[batch, A_r, length, length]`. With `A_r` equal to the number of attention heads, the
"qk" relation is exactly the layer's attention distribution (MiniLM v1); "vv" is the value
relation; "qq", "kk", "vv" together are MiniLMv2.

All relation logits, softmaxes and KLs run in float32, whatever the compute dtype.
"""

import jax
import jax.numpy as jnp

from minilm_jax.errors import UserError
from minilm_jax.kernels import attention as attention_kernel
from minilm_jax.kernels import relation_kl as relation_kl_kernel
from minilm_jax.kernels.attention import MASK_VALUE
from minilm_jax.kernels.platform import kernel_platform
from minilm_jax.models.attention import merge_heads, split_heads
from minilm_jax.models.encoder import LayerOutput

PROJECTIONS = ("q", "k", "v")
# The relation sets of the papers, by name.
RELATION_SETS = {
  "minilm": ("qk", "vv"),  # MiniLM v1: attention transfer + value relation
  "minilmv2": ("qq", "kk", "vv"),  # MiniLMv2: self-attention relations
}


def parse_relations(spec: str) -> tuple:
  """'minilm', 'minilmv2' or a comma list of pairs of q/k/v such as 'qk,vv'."""
  relations = RELATION_SETS.get(spec) or tuple(r.strip() for r in spec.split(",") if r.strip())
  bad = [r for r in relations if len(r) != 2 or any(c not in PROJECTIONS for c in r)]
  if bad or not relations:
    raise UserError(
      f"loss.relations={spec!r} is not understood: use {' or '.join(RELATION_SETS)} or pairs of q/k/v like 'qk,vv'"
    )
  return relations


def check_relation_heads(num_relation_heads: int, *hidden_sizes: int):
  for hidden in hidden_sizes:
    if hidden % num_relation_heads:
      raise UserError(
        f"loss.num_relation_heads={num_relation_heads} does not divide hidden size {hidden}: "
        f"choose a divisor of every model's hidden size"
      )


def relation_heads(x_BxHxLxK, num_relation_heads):
  """Re-splits a projection's attention heads into `num_relation_heads` heads: [B, A_r, L, hidden/A_r]."""
  return split_heads(merge_heads(x_BxHxLxK), num_relation_heads)


def _log_probs(x_BxAxQxD, y_BxAxLxD, mask_BxL):
  """log softmax(X Y^T / sqrt(d_r)) over keys, padding keys masked: [B, A_r, Q, L], float32."""
  logits = jnp.einsum("bhqd,bhkd->bhqk", x_BxAxQxD, y_BxAxLxD) / jnp.sqrt(jnp.float32(x_BxAxQxD.shape[-1]))
  logits = jnp.where(mask_BxL[:, None, None, :].astype(bool), logits, MASK_VALUE)
  return jax.nn.log_softmax(logits, axis=-1)


def relation_log_probs(x_BxHxLxK, y_BxHxLxK, mask_BxL, num_relation_heads):
  """The whole relation of two projections as log-probabilities: [B, A_r, L, L], float32."""
  x = relation_heads(x_BxHxLxK, num_relation_heads).astype(jnp.float32)
  y = relation_heads(y_BxHxLxK, num_relation_heads).astype(jnp.float32)
  return _log_probs(x, y, mask_BxL)


def _row_kl(teacher_logp, student_logp):
  """KL(teacher || student) of every query row; keys where the teacher's probability is 0
  (padding) contribute exactly 0."""
  p = jnp.exp(teacher_logp)
  return jnp.sum(jnp.where(p > 0, p * (teacher_logp - student_logp), 0.0), axis=-1)


def _normalise(kl_sum_B, num_relation_heads, mask_BxL):
  """Sum of row KLs per example -> average over relation heads and real query tokens, then over the batch."""
  num_real = jnp.maximum(mask_BxL.astype(jnp.float32).sum(-1), 1.0)
  return jnp.mean(kl_sum_B / (num_relation_heads * num_real))


def relation_kl(teacher_logp, student_logp, mask_BxL):
  """KL(teacher || student) per query row, averaged over relation heads and real query tokens of
  each example, then over the batch. Rows of padding queries are left out."""
  kl_BxAxL = _row_kl(teacher_logp, student_logp)
  kl_sum = jnp.sum(kl_BxAxL * mask_BxL.astype(jnp.float32)[:, None, :], axis=(1, 2))
  return _normalise(kl_sum, teacher_logp.shape[1], mask_BxL)


def chunked_relation_kl(teacher_xy, student_xy, mask_BxL, num_relation_heads, query_chunk):
  """The same value and gradient as `relation_kl` of the full relations, computed `query_chunk`
  query rows at a time. Each chunk is rematerialised in the backward pass, so no
  [B, A_r, L, L] tensor of teacher or student is ever alive whole: peak memory grows with
  B * A_r * query_chunk * L instead of B * A_r * L * L."""
  (tx, ty), (sx, sy) = [
    [relation_heads(z, num_relation_heads).astype(jnp.float32) for z in pair] for pair in (teacher_xy, student_xy)
  ]
  length = mask_BxL.shape[1]
  num_chunks = -(-length // query_chunk)
  pad = num_chunks * query_chunk - length
  query_mask = jnp.pad(mask_BxL.astype(jnp.float32), ((0, 0), (0, pad)))  # padded query rows weigh 0

  def chunks(x_BxAxLxD):  # [B, A, L, D] -> [num_chunks, B, A, chunk, D]
    b, a, _, d = x_BxAxLxD.shape
    x = jnp.pad(x_BxAxLxD, ((0, 0), (0, 0), (0, pad), (0, 0)))
    return x.reshape(b, a, num_chunks, query_chunk, d).transpose(2, 0, 1, 3, 4)

  @jax.checkpoint
  def chunk_kl(tx_c, sx_c, qmask_c):
    kl_BxAxC = _row_kl(_log_probs(tx_c, ty, mask_BxL), _log_probs(sx_c, sy, mask_BxL))
    return jnp.sum(kl_BxAxC * qmask_c[:, None, :], axis=(1, 2))

  def body(total_B, inputs):
    return total_B + chunk_kl(*inputs), None

  qmask_chunks = query_mask.reshape(-1, num_chunks, query_chunk).transpose(1, 0, 2)
  # The initial carry derives from the mask, not jnp.zeros: inside a shard_map step the mask varies
  # over devices, and a scan's carry must have the same (device-varying) type in and out.
  zeros_B = jnp.zeros_like(mask_BxL[:, 0], jnp.float32)
  kl_sum, _ = jax.lax.scan(body, zeros_B, (chunks(tx), chunks(sx), qmask_chunks))
  return _normalise(kl_sum, num_relation_heads, mask_BxL)


def fused_relation_kl(teacher_xy, student_xy, mask_BxL, num_relation_heads, platform: str, tiling=None):
  """`relation_kl` of the full relations by the fused kernel (`kernels.relation_kl`, its blocks
  `tiling` or the platform's): neither [B, A_r, L, L] relation is written to HBM, on any length."""
  (tx, ty), (sx, sy) = [[relation_heads(z, num_relation_heads) for z in pair] for pair in (teacher_xy, student_xy)]
  kl_BxAxL = relation_kl_kernel.relation_kl_rows((tx, ty), (sx, sy), mask_BxL, platform, tiling=tiling)
  kl_sum = jnp.sum(kl_BxAxL * mask_BxL.astype(jnp.float32)[:, None, :], axis=(1, 2))
  return _normalise(kl_sum, num_relation_heads, mask_BxL)


def minilm_loss(
  teacher: LayerOutput, student: LayerOutput, mask_BxL, relations, num_relation_heads, query_chunk: int = 0
):
  """One KL term per relation, e.g. {"qk": ..., "vv": ...}; the total loss is their sum (eq. 10).
  On accelerators the fused kernel computes each (`fused_relation_kl`); elsewhere `query_chunk` > 0
  computes each relation that many query rows at a time (same value, bounded memory)."""
  teacher = jax.lax.stop_gradient(teacher)
  length = mask_BxL.shape[1]
  platform = kernel_platform()
  terms = {}
  for rel in relations:
    t_xy = (getattr(teacher, rel[0]), getattr(teacher, rel[1]))
    s_xy = (getattr(student, rel[0]), getattr(student, rel[1]))
    dims = [z.shape[1] * z.shape[3] // num_relation_heads for z in (*t_xy, *s_xy)]
    if platform and all(attention_kernel.supported(length, d, platform) for d in dims):
      terms[rel] = fused_relation_kl(t_xy, s_xy, mask_BxL, num_relation_heads, platform)
    elif query_chunk:
      terms[rel] = chunked_relation_kl(t_xy, s_xy, mask_BxL, num_relation_heads, query_chunk)
    else:
      t = relation_log_probs(*t_xy, mask_BxL, num_relation_heads)
      s = relation_log_probs(*s_xy, mask_BxL, num_relation_heads)
      terms[rel] = relation_kl(t, s, mask_BxL)
  return terms
