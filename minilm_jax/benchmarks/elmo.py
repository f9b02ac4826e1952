"""ELMo's published shape (Peters et al. 2018, the "original" 5.5B model: `elmo_2x4096_512_2048cnn_2xhighway`),
for the row of the thesis's table 3.2 that times ELMo: speed only, random weights.

Characters of each token (50, 262 symbols) -> 16-d embeddings -> convolutions of widths 1-7 with
32, 32, 64, 128, 256, 512 and 1024 filters, max over the characters, ReLU -> 2 highway layers ->
projection to 512 -> two biLSTM layers (a forward and a backward language model), each of 4096
cells projected to 512 with cell and projection clipping at 3, the second layer's input added to
its output -> the three layers mixed by softmax-normalised scalars -> [B, L, 1024]. On top, as a
task model reads ELMo: the token vectors max-pooled to a sentence vector, a pair of sentences
compared as the siamese BiLSTM compares them `[h1, h2, h1 * h2, |h1 - h2|]`, and the students' task
head. The thesis counts 93.6M parameters for ELMo (GLUE's baseline); this shape has about 93.6M
too, the most of them in the LSTMs' 4096-cell gates.
"""

from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp

CHARACTERS = 262  # ELMo's character vocabulary: 256 bytes and its begin/end/padding marks
CHARS_PER_TOKEN = 50
FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
CELLS, PROJECTION, CLIP = 4096, 512, 3.0


class ProjectedLSTMCell(nn.RNNCellBase):
  """An LSTM cell whose output (and recurrent state) is a projection of its cells, both clipped
  (ELMo's `LstmCellWithProjection`)."""

  cells: int
  projection: int
  clip: float

  @nn.compact
  def __call__(self, carry, x):
    c, h = carry
    i, f, g, o = jnp.split(nn.Dense(4 * self.cells, name="gates")(jnp.concatenate([x, h], -1)), 4, -1)
    c = jnp.clip(nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g), -self.clip, self.clip)
    h = jnp.clip(
      nn.Dense(self.projection, use_bias=False, name="project")(nn.sigmoid(o) * jnp.tanh(c)), -self.clip, self.clip
    )
    return (c, h), h

  @nn.nowrap
  def initialize_carry(self, rng, input_shape):
    batch = input_shape[:-1]
    return jnp.zeros((*batch, self.cells)), jnp.zeros((*batch, self.projection))

  @property
  def num_feature_axes(self) -> int:
    return 1


class CharacterEncoder(nn.Module):
  """A token's characters [B, L, 50] -> its context-free vector [B, L, 512]."""

  @nn.compact
  def __call__(self, chars):
    batch, length, width = chars.shape
    x = nn.Embed(CHARACTERS, 16, name="chars")(chars.reshape(batch * length, width))
    pooled = [jnp.max(nn.Conv(n, (w,), padding="VALID", name=f"conv{w}")(x), axis=1) for w, n in FILTERS]
    x = nn.relu(jnp.concatenate(pooled, -1))  # [B * L, 2048]
    for k in range(2):
      gate = nn.sigmoid(nn.Dense(x.shape[-1], name=f"highway{k}_gate")(x))
      x = gate * x + (1 - gate) * nn.relu(nn.Dense(x.shape[-1], name=f"highway{k}")(x))
    return nn.Dense(PROJECTION, name="project")(x).reshape(batch, length, PROJECTION)


class ELMoBody(nn.Module):
  """Sentence features for a task head: max-pooled ELMo vectors of one sentence, or of a pair
  compared. Batches carry characters: `input_chars` (and `input_chars_b`) [B, L, 50], `attention_mask`."""

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    del deterministic  # timing only: no dropout
    characters = CharacterEncoder(name="characters")
    directions = {
      name: [
        nn.RNN(
          ProjectedLSTMCell(CELLS, PROJECTION, CLIP, parent=None), reverse=reverse, keep_order=True, name=f"{name}{k}"
        )
        for k in range(2)
      ]
      for name, reverse in (("forward", False), ("backward", True))
    }
    weights = nn.softmax(self.param("mix", nn.initializers.zeros, (3,)))

    def encode(chars, mask):
      tokens, lengths = characters(chars), mask.sum(-1)
      layers = [jnp.concatenate([tokens, tokens], -1)]
      inputs = dict.fromkeys(directions, tokens)
      for k in range(2):
        # Without return_carry an RNN returns its outputs alone.
        outputs = {
          name: cast(jax.Array, stack[k](inputs[name], seq_lengths=lengths)) for name, stack in directions.items()
        }
        if k == 1:  # the residual connection between the layers
          outputs = {name: out + inputs[name] for name, out in outputs.items()}
        layers.append(jnp.concatenate(list(outputs.values()), -1))
        inputs = outputs
      mixed = sum(w * layer for w, layer in zip(weights, layers))  # [B, L, 1024]
      return jnp.max(jnp.where(mask[..., None].astype(bool), mixed, -1e30), axis=1)

    h1 = encode(batch["input_chars"], batch["attention_mask"])
    if "input_chars_b" not in batch:
      return h1
    h2 = encode(batch["input_chars_b"], batch["attention_mask_b"])
    return jnp.concatenate([h1, h2, h1 * h2, jnp.abs(h1 - h2)], -1)
