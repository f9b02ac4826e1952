"""Attention dropout's keep mask as a pure function of (seed, batch row, head, query, key).

A kernel that never writes the [B, H, L, L] mask to HBM must be able to make any block of it
where it needs it, in the forward pass and again in the backward pass: so each entry's random bits
are a hash of its coordinates and a per-step seed (a counter-based generator, as Philox and
threefry are), computed in 32-bit integer arithmetic that Triton, Mosaic and XLA all lower. The
hash is Wellons' "lowbias32" (two rounds of xor-shift-multiply, a full-avalanche 32-bit
permutation), applied twice: once to the seed mixed with the (row, head) pair, once more with the
(query, key) pair. About 20 integer operations an entry, where `jax.random.bernoulli`'s threefry
costs about 46 and writes 4 bytes an entry to HBM.

`keep_mask` is the reference the tests hold the kernels to: the explicit path with this mask
drops exactly what the kernel drops.
"""

import jax
import jax.numpy as jnp

# Odd constants of lowbias32 and the golden-ratio increment, as int32 (the arithmetic wraps mod 2^32).
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)
_GOLDEN = 0x9E3779B9 - (1 << 32)
# Keep an entry when its top 24 random bits are at least rate * 2^24.
_BITS = 24


def _lowbias32(x):
  x = x ^ jax.lax.shift_right_logical(x, 16)
  x = x * _M1
  x = x ^ jax.lax.shift_right_logical(x, 15)
  x = x * _M2
  return x ^ jax.lax.shift_right_logical(x, 16)


def threshold(rate: float) -> int:
  """The integer the top 24 bits are compared with: P(keep) = 1 - rate to within 2^-24."""
  return int(round(rate * (1 << _BITS)))


def keep_block(seed, row_head, query_LxK, key_LxK, length: int, rate: float):
  """Keep (True) or drop of a block of entries: `seed` int32 (any shape broadcasting), `row_head`
  the flat index batch_row * heads + head, `query_LxK` and `key_LxK` int32 coordinates of the
  block's entries, `length` the key length (the row stride)."""
  base = _lowbias32(seed + (row_head + 1) * _GOLDEN)
  bits = _lowbias32(base ^ (query_LxK * length + key_LxK))
  return jax.lax.shift_right_logical(bits, 32 - _BITS) >= threshold(rate)


def keep_mask(seed, batch: int, heads: int, length: int, rate: float, key_length: int | None = None):
  """The whole [B, H, L, L] keep mask the kernels make block by block (the explicit path's, and the
  tests' reference); [B, H, L, key_length] where queries attend over more keys (a decoding cache)."""
  key_length = key_length or length
  b = jnp.arange(batch, dtype=jnp.int32)[:, None, None, None]
  h = jnp.arange(heads, dtype=jnp.int32)[None, :, None, None]
  q = jnp.arange(length, dtype=jnp.int32)[None, None, :, None]
  k = jnp.arange(key_length, dtype=jnp.int32)[None, None, None, :]
  return keep_block(jnp.asarray(seed, jnp.int32), b * heads + h, q, k, key_length, rate)


def keep_like(seed, shape, rate: float):
  """Keep (True) or drop of every entry of an array of `shape` (a hidden state's dropout): the same
  hash, of the seed and each entry's flat row-major index (wrapping at 2^32, as the arithmetic does)."""
  flat = jnp.zeros((), jnp.int32)
  for axis, size in enumerate(shape):
    flat = flat * size + jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  bits = _lowbias32(_lowbias32(jnp.asarray(seed, jnp.int32)) ^ flat)
  return jax.lax.shift_right_logical(bits, 32 - _BITS) >= threshold(rate)


def seed_from_key(rng) -> jax.Array:
  """A step's int32 dropout seed from its dropout rng key (fresh every step, as the key is)."""
  return jax.lax.bitcast_convert_type(jax.random.bits(rng, (), jnp.uint32), jnp.int32)
