"""How a kernel's [.., .., .., ..] operands sit in memory, and the blocks it reads and writes.

The kernels compute in one orientation on every platform: a block of one (example, head) is held
as [head size, rows] (rows along the last axis), and a block of scores as [keys, queries], so that
every per-query statistic (maximum, sum, log-sum-exp) is a [1, queries] row. On a TPU that is the
memory layout too ([B, H, K, L]: the length on the 128 lanes, the head size of 32 or 64 on the
sublanes; a [B, H, L, K] array with K = 32 would be padded to 128 lanes, four times its size), and
the per-query statistics are lane-dense [B, H, 1, L] rows. On a GPU the operands stay as the
model makes them ([B, L, H, K] for attention, [B, A, L, d] for relations: no transpose in HBM),
and a block is transposed as it is loaded (Triton does that in registers).
"""

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl

# Where batch (b), head (h), length (l) and head size (k) sit.
ORDERS = ("blhk", "bhlk", "bhkl")


@dataclasses.dataclass(frozen=True)
class Layout:
  order: str

  def __post_init__(self):
    assert self.order in ORDERS, self.order

  @property
  def rows_last(self) -> bool:
    """Whether rows (the length) are the last axis, as the kernels compute."""
    return self.order.endswith("l")

  def dims(self, x) -> tuple:
    """(batch, heads, length, head size) of an operand in this layout."""
    sizes = dict(zip(self.order, x.shape))
    return sizes["b"], sizes["h"], sizes["l"], sizes["k"]

  def to(self, x_in_order: str, x):
    """`x` ([.., .., .., ..] in `x_in_order`) transposed into this layout."""
    return x.transpose([x_in_order.index(axis) for axis in self.order])

  def spec(self, rows: int, dim: int, blocked: bool) -> pl.BlockSpec:
    """`rows` rows of one (example, head) over a grid (b, h[, i]): the i-th block, or all of them."""
    block = {"b": None, "h": None, "l": rows, "k": dim}

    def index(b, h, *i):
      return tuple({"b": b, "h": h, "l": i[0] if blocked else 0, "k": 0}[axis] for axis in self.order)

    return pl.BlockSpec(tuple(block[axis] for axis in self.order), index)

  def load(self, ref, rows=slice(None)):
    """The block's rows as [head size, rows]."""
    return ref[:, rows] if self.rows_last else ref[rows, :].T

  def store(self, ref, value_KxR, rows=slice(None)):
    if self.rows_last:
      ref[:, rows] = value_KxR.astype(ref.dtype)
    else:
      ref[rows, :] = value_KxR.T.astype(ref.dtype)

  def add(self, ref, value_KxR, rows):
    self.store(ref, self.load(ref, rows) + value_KxR, rows)

  def zero(self, ref, length: int, block: int):
    """Zeroes a whole-length block `block` rows at a time (Triton takes only arrays whose sizes are
    powers of two, and a length such as 384 is not)."""
    for start in range(0, length, block):
      rows = pl.ds(start, block)
      if self.rows_last:
        ref[:, rows] = jnp.zeros((ref.shape[0], block), ref.dtype)
      else:
        ref[rows, :] = jnp.zeros((block, ref.shape[1]), ref.dtype)


def block_rows(index, block: int):
  """The `index`-th block of `block` rows, as the kernels' loops slice their operands."""
  return pl.ds(pl.multiple_of(index * block, block), block)


def for_platform(platform: str, gpu_order: str) -> Layout:
  """[B, H, K, L] on TPUs; elsewhere the operands' own order."""
  return Layout("bhkl" if platform == "tpu" else gpu_order)


def stat_spec(rows: int, blocked: bool) -> pl.BlockSpec:
  """A per-query statistic, [B, H, 1, L]: the i-th block of `rows` of one (example, head), or all."""
  return pl.BlockSpec((None, None, 1, rows), lambda b, h, *i: (b, h, 0, i[0] if blocked else 0))


def key_mask_spec(length: int) -> pl.BlockSpec:
  """The key mask as a column, [B, L, 1] (keys run down a block of scores), whole per example."""
  return pl.BlockSpec((None, length, 1), lambda b, h, *i: (b, 0, 0))


def key_mask_column(mask_BxL):
  return mask_BxL.astype(jnp.int32)[:, :, None]
