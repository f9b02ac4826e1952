"""Dropout's keep mask as a pure function of (seed, batch row, head, query, key).

A kernel that never writes the [B, H, L, L] mask to HBM must be able to make any block of it
where it needs it, in the forward pass and again in the backward pass: so each entry's random bits
are a hash of its coordinates and a per-step seed (a counter-based generator, as Philox and
threefry are), computed in 32-bit integer arithmetic that Triton, Mosaic and XLA all lower. The
hash is Wellons' "lowbias32" (two rounds of xor-shift-multiply, a full-avalanche 32-bit
permutation), applied twice: once to the seed mixed with the (row, head) pair (one word a program),
once more with the word's index.

One 32-bit word gives the bits of four neighbouring keys of a query, a byte each (keys 4w to
4w + 3 take bytes 0 to 3 of word w): the hash was what bounded the attention kernel on an H100
(about 20 integer operations an entry, against 14 x 32 FLOPs of tensor-core products), and a word
shared by four entries costs about a quarter of that plus three operations to take its byte. A key
is kept when its byte is at least round(rate * 256): the rate is drawn in steps of 1/256 (0.1 is
drawn as 26/256 = 0.1016) and the kept entries are scaled by the drawn keep probability
(`scale`), so the expected value is unchanged. Bytes, not 16-bit halves: two entries a word would
leave half the hash, and 1/256 steps are finer than any rate a recipe tunes.

`keep_mask` is the reference the tests hold the kernels to: the explicit path with this mask
drops exactly what the kernel drops. Hidden-state dropout (`keep_like`) reads the same words over
each entry's flat index.
"""

import jax
import jax.numpy as jnp

from minilm_jax.errors import UserError

# Odd constants of lowbias32 and the golden-ratio increment, as int32 (the arithmetic wraps mod 2^32).
_M1 = 0x7FEB352D
_M2 = 0x846CA68B - (1 << 32)
_GOLDEN = 0x9E3779B9 - (1 << 32)
# Entries a 32-bit word decides, a byte each.
ENTRIES_PER_WORD = 4
_BITS = 32 // ENTRIES_PER_WORD
_WORD_SHIFT = 2  # log2(ENTRIES_PER_WORD): an entry's word and byte by a shift and a mask, no division
_LEVELS = 1 << _BITS


def _lowbias32(x):
  x = x ^ jax.lax.shift_right_logical(x, 16)
  x = x * _M1
  x = x ^ jax.lax.shift_right_logical(x, 15)
  x = x * _M2
  return x ^ jax.lax.shift_right_logical(x, 16)


def threshold(rate: float, field: str = "dropout rate") -> int:
  """The byte value from which an entry is kept: round(rate * 256). A rate below 1/512 would draw
  no dropout at all, one of 0.998 or more (below 1) would keep no entry; both are refused, the
  config's `field` named."""
  level = int(round(rate * _LEVELS))
  if rate > 0 and level == 0:
    raise UserError(f"{field}={rate} is below 1/512, the smallest the 8-bit mask draws: use 0 or at least 0.002")
  if rate < 1 and level == _LEVELS:
    raise UserError(
      f"{field}={rate} rounds to 256/256 in the 8-bit dropout mask, which keeps nothing: use at most 0.998"
    )
  return level


def scale(rate: float) -> float:
  """What a kept entry is multiplied by: one over the drawn keep probability, 1 - threshold / 256."""
  return _LEVELS / (_LEVELS - threshold(rate))


def row_base(seed, row_head):
  """The hash state of one (batch row, head): every word of its [L, L] block starts from it."""
  return _lowbias32(seed + (row_head + 1) * _GOLDEN)


def words(base, query, word_in_row, words_per_row: int):
  """The 32-bit words of the queries' rows: `word_in_row` w covers keys 4w to 4w + 3."""
  return _lowbias32(base ^ (query * words_per_row + word_in_row))


def byte_keeps(bits, byte, rate: float):
  """Keep (True) of the entries whose bits are byte `byte` (an int or int32 array of 0-3) of `bits`."""
  bits, shift = jnp.broadcast_arrays(bits, jnp.asarray(byte * _BITS, jnp.int32))
  value = jax.lax.shift_right_logical(bits, shift) & (_LEVELS - 1)
  return value >= threshold(rate)


def words_per_row(key_length: int) -> int:
  return -(-key_length // ENTRIES_PER_WORD)


def word_of(key):
  """The word (within its row) of int32 key index `key`."""
  return jax.lax.shift_right_logical(key, _WORD_SHIFT)


def byte_of(key):
  """The byte of its word that decides int32 key index `key`."""
  return key & (ENTRIES_PER_WORD - 1)


def entry_keeps(base, query_LxK, key_LxK, key_length: int, rate: float):
  """Keep (True) or drop of a block of entries, each on its own (the kernels' path for blocks that
  are not whole words, and the tests' check of `spread_keeps`): `base` the (row, head)'s
  `row_base`, `query_LxK` and `key_LxK` int32 coordinates of the block's entries, `key_length` the
  row's keys."""
  bits = words(base, query_LxK, word_of(key_LxK), words_per_row(key_length))
  return byte_keeps(bits, byte_of(key_LxK), rate)


def spread(bits, axis: int):
  """Words [.., n, ..] -> [.., 4 n, ..] along `axis`, each repeated for its four entries (a broadcast
  and a reshape: Triton and Mosaic lower both, where Triton joins only two arrays at a time)."""
  shape = bits.shape
  wide = (*shape[: axis + 1], ENTRIES_PER_WORD, *shape[axis + 1 :])
  dims = tuple(d if d <= axis else d + 1 for d in range(len(shape)))
  return jax.lax.broadcast_in_dim(bits, wide, dims).reshape(*shape[:axis], -1, *shape[axis + 1 :])


def spread_keeps(bits, axis: int, rate: float):
  """Keep (True) of the entries of words [.., n, ..] spread along `axis` ([.., 4 n, ..]): entry
  4w + b of that axis from byte b of word w."""
  bits = spread(bits, axis)
  return byte_keeps(bits, byte_of(jax.lax.broadcasted_iota(jnp.int32, bits.shape, axis)), rate)


def keep_mask(seed, batch: int, heads: int, length: int, rate: float, key_length: int | None = None):
  """The whole [B, H, L, L] keep mask the kernels make block by block (the explicit path's, and the
  tests' reference); [B, H, L, key_length] where queries attend over more keys (a decoding cache)."""
  key_length = key_length or length
  per_row = words_per_row(key_length)
  b = jnp.arange(batch, dtype=jnp.int32)[:, None, None, None]
  h = jnp.arange(heads, dtype=jnp.int32)[None, :, None, None]
  q = jnp.arange(length, dtype=jnp.int32)[None, None, :, None]
  w = jnp.arange(per_row, dtype=jnp.int32)[None, None, None, :]
  bits = words(row_base(jnp.asarray(seed, jnp.int32), b * heads + h), q, w, per_row)
  return spread_keeps(bits, 3, rate)[..., :key_length]


def keep_like(seed, shape, rate: float):
  """Keep (True) or drop of every entry of an array of `shape` (a hidden state's dropout): the same
  words, each the hash of the seed and its flat row-major index among the words of every row
  (entry j of a row from byte j % 4 of the row's word j // 4; the index wraps at 2^32, as the
  arithmetic does). Entry by entry, each entry hashing its word: elementwise, so XLA fuses it into
  its consumer on every chip (spread from [.., D / 4] words, a TPU wrote and read the mask through
  HBM: 8 % more bytes a v5e step)."""
  *rows, last = shape
  row = jnp.zeros((), jnp.int32)
  for axis, size in enumerate(rows):
    row = row * size + jax.lax.broadcasted_iota(jnp.int32, shape, axis)
  key = jax.lax.broadcasted_iota(jnp.int32, shape, len(shape) - 1)
  bits = _lowbias32(_lowbias32(jnp.asarray(seed, jnp.int32)) ^ (row * words_per_row(last) + word_of(key)))
  return byte_keeps(bits, byte_of(key), rate)


def seed_from_key(rng) -> jax.Array:
  """A step's int32 dropout seed from its dropout rng key (fresh every step, as the key is)."""
  return jax.lax.bitcast_convert_type(jax.random.bits(rng, (), jnp.uint32), jnp.int32)
