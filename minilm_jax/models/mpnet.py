"""MPNet (`mpnet`): BERT's layers whose attention scores are biased by bucketed relative position, as
transformers' `MPNetModel`: one learned value a bucket and head, a table shared by every layer; no
token types, positions numbered from padding_idx + 1 as RoBERTa's."""

import math

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from minilm_jax.models.config import MPNET_BUCKETS, EncoderConfig

# transformers' MPNet buckets relative positions into 32 buckets up to a distance of 128, whatever
# its table's size (`MPNetEncoder.compute_position_bias`).
RELATIVE_ATTENTION_BUCKETS, RELATIVE_ATTENTION_MAX_DISTANCE = MPNET_BUCKETS, 128


def relative_position_buckets(length: int) -> np.ndarray:
  """[L, L] bucket of each (query, key) pair's relative position, as transformers' MPNet buckets it
  (T5's bidirectional scheme: half the buckets a direction, exact up to 8 apart, then logarithmic up
  to 128), in float32 as it computes it, so that every boundary falls where it falls there."""
  relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # key position - query position
  n = -relative
  half = RELATIVE_ATTENTION_BUCKETS // 2
  exact = half // 2
  buckets = (n < 0).astype(np.int64) * half
  n = np.abs(n)
  with np.errstate(divide="ignore"):  # log(0) where the exact bucket is taken
    scaled = np.log(n.astype(np.float32) / np.float32(exact)) / np.float32(
      math.log(RELATIVE_ATTENTION_MAX_DISTANCE / exact)
    )
    large = exact + np.nan_to_num(scaled * np.float32(half - exact), neginf=0.0).astype(np.int64)
  return buckets + np.where(n < exact, n, np.minimum(large, half - 1))


class RelativePositionBias(nn.Module):
  """[1, H, L, L] float32 bias of the attention scores by relative position (MPNet's): one learned
  value a bucket and head (`relative_position_buckets`), shared by every layer."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, length: int):
    c = self.config
    table = self.param(
      "embedding",
      nn.initializers.normal(c.initializer_range),
      (c.relative_attention_buckets, c.num_heads),
      jnp.float32,
    )
    return table[relative_position_buckets(length)].transpose(2, 0, 1)[None]
