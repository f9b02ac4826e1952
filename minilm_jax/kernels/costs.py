"""What each kernel does, counted from its code: the one place for the kernels' FLOPs and the rest of
their work, read by `aot`'s check of the compiled program (`FLOPS`, from a call's operands), the
step's analytic parts (`models.flops`) and each kernel's bound on a chip (`bench kernels`).

Counted per entry of a [L, L] block of scores (one head, one query, one key), forward and backward:
- matrix products: 2 FLOPs per multiply-add, per unit of head size;
- exponentials (the transcendental unit);
- integer instructions: the dropout words (`attention._keep`, `dropout.words`: the word's and the
  query's index, 2 adds; the index in the row, a multiply and an add; the xor with the row's state;
  lowbias32's three xor-shifts and two multiplies: 13) once per four
  entries, then each entry's byte (`dropout.spread_keeps`: its shift from the key's position, 2;
  the shift, the mask and the comparison: 5);
- other vector instructions (floating-point, selects, conversions), each `jnp` operation on the
  block one instruction an entry; an exponential issues two (a multiply by log2(e), then exp2);
- bytes that must cross HBM at least once: every operand read and every result written once (the
  kernels reread K and V once per block of queries, mostly from L2; not counted).
Per-row work (maxima, rescaling, log-sum-exps) is a 1/L share of an entry's and left out.
"""

import dataclasses
import math

# Pallas call names (the compiled program's, `aot.report`'s): the kernel modules import these.
ATTENTION_FORWARD, ATTENTION_BACKWARD = "minilm_flash_fwd", "minilm_flash_bwd"
RELATION_KL_FORWARD, RELATION_KL_BACKWARD = "minilm_relation_kl_fwd", "minilm_relation_kl_bwd"

# The dropout mask, per entry: a word's 13 integer instructions shared by four entries
# (`dropout.ENTRIES_PER_WORD`), then 5 for the entry's byte.
_WORD_INTEGER_OPS, _BYTE_INTEGER_OPS, _ENTRIES_PER_WORD = 13, 5, 4
MASK_INTEGER_OPS = _WORD_INTEGER_OPS / _ENTRIES_PER_WORD + _BYTE_INTEGER_OPS


@dataclasses.dataclass(frozen=True)
class Work:
  """One kernel call's work: `products` FLOPs, `exponentials`, `integer_ops`, `other_vector_ops`
  (floating-point and the rest) and `hbm_bytes`."""

  products: float
  exponentials: float
  integer_ops: float
  other_vector_ops: float
  hbm_bytes: float

  @property
  def vector_ops(self) -> float:
    """Every vector instruction issued besides the tensor cores' (integer ones included)."""
    return self.integer_ops + self.other_vector_ops


def _per_entry(entries: float, product_flops: float, exponentials: float, vector_ops: float, masked: bool, nbytes):
  integer = MASK_INTEGER_OPS if masked else 0.0
  return Work(
    products=entries * product_flops,
    exponentials=entries * exponentials,
    integer_ops=entries * integer,
    other_vector_ops=entries * (vector_ops + 2 * exponentials),
    hbm_bytes=nbytes,
  )


# Attention per entry and unit of head size: forward the scores and the weighted sum (2 products);
# backward the scores recomputed, dV, dP, dQ and dK (5 products). Other vector instructions per entry
# (`attention._forward_kernel`, `_backward_kernel`), besides the exponential's two: forward the scale,
# the padding select, the maximum, the subtraction, the sum, the dropout select and scale, the cast
# (8); backward the scale, the padding select, the subtraction of the log-sum-exp, the dropout
# select, P Z, its cast, dP Z, dP - D, P (dP - D) and its cast (10). Without dropout, 2 and 3 fewer.
ATTENTION_PRODUCTS = {ATTENTION_FORWARD: 2 * 2, ATTENTION_BACKWARD: 5 * 2}
_ATTENTION_VECTOR = {ATTENTION_FORWARD: (8, 2), ATTENTION_BACKWARD: (10, 3)}


def attention(batch: int, heads: int, length: int, head_dim: int, rate: float, itemsize: int = 2) -> dict:
  """{kernel name: Work} of one layer's attention, forward and backward, `itemsize` bytes an
  operand element (bfloat16: 2)."""
  entries, elements = batch * heads * length * length, batch * heads * length * head_dim
  rows = batch * heads * length * 4  # a float32 statistic a query row (log-sum-exp; D)
  # Forward reads Q, K, V and writes O and the log-sum-exps; backward reads Q, K, V, dO, the
  # log-sum-exps and D, and writes dQ (float32), dK and dV.
  nbytes = {
    ATTENTION_FORWARD: 4 * elements * itemsize + rows,
    ATTENTION_BACKWARD: 4 * elements * itemsize + 2 * rows + elements * (4 + 2 * itemsize),
  }
  work = {}
  for name, per_dim in ATTENTION_PRODUCTS.items():
    vector, without_dropout = _ATTENTION_VECTOR[name]
    vector -= 0 if rate > 0 else without_dropout
    work[name] = _per_entry(entries, per_dim * head_dim, 1, vector, rate > 0, nbytes[name])
  return work


# The relation KL per entry: forward the teacher's and the student's logits (one product each, of
# their own head sizes); backward both recomputed, then the student's two gradients. Other vector
# instructions per entry (`relation_kl._forward_kernel`, `_backward_kernel`), besides the
# exponentials': forward per model the scale, the padding select, the maximum, the subtraction and
# the sum (10), then t - s, its product with exp(t) and their sum (3); backward per model the
# scale, the padding select and the subtraction (6), then p_s - p_t, its product with g, the
# padding select and the cast (4).
def _relation_products(teacher_dim: int, student_dim: int) -> dict:
  return {
    RELATION_KL_FORWARD: 2 * teacher_dim + 2 * student_dim,
    RELATION_KL_BACKWARD: 2 * teacher_dim + 3 * 2 * student_dim,
  }


_RELATION_VECTOR = {RELATION_KL_FORWARD: 13, RELATION_KL_BACKWARD: 10}


def relation_kl(batch: int, heads: int, length: int, teacher_dim: int, student_dim: int, itemsize: int = 2) -> dict:
  """{kernel name: Work} of one relation KL over `heads` relation heads, forward and backward."""
  entries = batch * heads * length * length
  teacher, student = (batch * heads * length * d * itemsize for d in (teacher_dim, student_dim))
  rows = batch * heads * length * 4
  # Forward reads both models' X and Y, writes the row KLs and both log-sum-exps; backward reads them
  # again with the log-sum-exps and the cotangents, and writes dX (float32) and dY.
  nbytes = {
    RELATION_KL_FORWARD: 2 * (teacher + student) + 3 * rows,
    RELATION_KL_BACKWARD: 2 * (teacher + student) + 3 * rows + student * (4 // itemsize + 1),
  }
  return {
    name: _per_entry(entries, flops, 2, _RELATION_VECTOR[name], False, nbytes[name])
    for name, flops in _relation_products(teacher_dim, student_dim).items()
  }


def attention_flops_of_operands(name: str, operand_dims: list) -> float:
  """A compiled attention call's product FLOPs from its operands (seed, key mask [B, L, 1], Q, K, V,
  ...): Q's B H L K elements in any layout times the length."""
  return ATTENTION_PRODUCTS[name] * math.prod(operand_dims[2]) * operand_dims[1][1]


def relation_kl_flops_of_operands(name: str, operand_dims: list) -> float:
  """A compiled relation-KL call's product FLOPs from its operands (key mask [B, L, 1], teacher X,
  teacher Y, student X, student Y, ...): each side's B A L d elements times the length, per unit of
  the head sizes' products (`_relation_products` at unit sizes)."""
  length = operand_dims[0][1]
  teacher, student = math.prod(operand_dims[1]) * length, math.prod(operand_dims[3]) * length
  per_teacher_dim = _relation_products(1, 0)[name]
  per_student_dim = _relation_products(0, 1)[name]
  return per_teacher_dim * teacher + per_student_dim * student


# aot's check: the products of each named Pallas call, from its operands' dims.
FLOPS = {
  ATTENTION_FORWARD: lambda dims: attention_flops_of_operands(ATTENTION_FORWARD, dims),
  ATTENTION_BACKWARD: lambda dims: attention_flops_of_operands(ATTENTION_BACKWARD, dims),
  RELATION_KL_FORWARD: lambda dims: relation_kl_flops_of_operands(RELATION_KL_FORWARD, dims),
  RELATION_KL_BACKWARD: lambda dims: relation_kl_flops_of_operands(RELATION_KL_BACKWARD, dims),
}
