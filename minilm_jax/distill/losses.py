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
from minilm_jax.models.encoder import MASK_VALUE, LayerOutput, merge_heads, split_heads

PROJECTIONS = ("q", "k", "v")
# The relation sets of the papers, by name.
RELATION_SETS = {
    "minilm": ("qk", "vv"),        # MiniLM v1: attention transfer + value relation
    "minilmv2": ("qq", "kk", "vv"),  # MiniLMv2: self-attention relations
}


def parse_relations(spec: str) -> tuple:
  """'minilm', 'minilmv2' or a comma list of pairs of q/k/v such as 'qk,vv'."""
  relations = RELATION_SETS.get(spec) or tuple(r.strip() for r in spec.split(",") if r.strip())
  bad = [r for r in relations if len(r) != 2 or any(c not in PROJECTIONS for c in r)]
  if bad or not relations:
    raise UserError(f"loss.relations={spec!r} is not understood: use {' or '.join(RELATION_SETS)} or pairs of q/k/v like 'qk,vv'")
  return relations


def check_relation_heads(num_relation_heads: int, *hidden_sizes: int):
  for hidden in hidden_sizes:
    if hidden % num_relation_heads:
      raise UserError(f"loss.num_relation_heads={num_relation_heads} does not divide hidden size {hidden}: "
                      f"choose a divisor of every model's hidden size")


def relation_heads(x_BxHxLxK, num_relation_heads):
  """Re-splits a projection's attention heads into `num_relation_heads` heads: [B, A_r, L, hidden/A_r]."""
  return split_heads(merge_heads(x_BxHxLxK), num_relation_heads)


def relation_log_probs(x_BxHxLxK, y_BxHxLxK, mask_BxL, num_relation_heads):
  """log softmax(X Y^T / sqrt(d_r)) over keys, padding keys masked: [B, A_r, L, L], float32."""
  x = relation_heads(x_BxHxLxK, num_relation_heads).astype(jnp.float32)
  y = relation_heads(y_BxHxLxK, num_relation_heads).astype(jnp.float32)
  logits = jnp.einsum("bhqd,bhkd->bhqk", x, y) / jnp.sqrt(jnp.float32(x.shape[-1]))
  logits = jnp.where(mask_BxL[:, None, None, :].astype(bool), logits, MASK_VALUE)
  return jax.nn.log_softmax(logits, axis=-1)


def relation_kl(teacher_logp, student_logp, mask_BxL):
  """KL(teacher || student) per query row, averaged over relation heads and real query tokens of
  each example, then over the batch. Rows of padding queries are left out; keys where the teacher's
  probability is 0 (padding) contribute exactly 0."""
  p = jnp.exp(teacher_logp)
  kl_BxAxL = jnp.sum(jnp.where(p > 0, p * (teacher_logp - student_logp), 0.0), axis=-1)
  mask = mask_BxL.astype(jnp.float32)
  num_heads = teacher_logp.shape[1]
  per_example = jnp.sum(kl_BxAxL * mask[:, None, :], axis=(1, 2)) / (num_heads * jnp.maximum(mask.sum(-1), 1.0))
  return jnp.mean(per_example)


def minilm_loss(teacher: LayerOutput, student: LayerOutput, mask_BxL, relations, num_relation_heads):
  """One KL term per relation, e.g. {"qk": ..., "vv": ...}; the total loss is their sum (eq. 10)."""
  teacher = jax.lax.stop_gradient(teacher)
  terms = {}
  for rel in relations:
    a, b = rel
    t = relation_log_probs(getattr(teacher, a), getattr(teacher, b), mask_BxL, num_relation_heads)
    s = relation_log_probs(getattr(student, a), getattr(student, b), mask_BxL, num_relation_heads)
    terms[rel] = relation_kl(t, s, mask_BxL)
  return terms
