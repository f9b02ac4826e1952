"""The thesis's LSTM student bodies: each maps a batch to one feature vector per example, which a
task head (`students.TaskHead`) turns into logits.

- `BiLSTMBody` (chapter 3, figures 3.1 and 3.2): word embeddings -> one BiLSTM -> the last hidden
  state of each direction, concatenated. A batch of pairs goes through the one BiLSTM (siamese) and
  the concatenate-compare `[h1, h2, h1 * h2, |h1 - h2|]`; so one body serves single-sentence and
  pair tasks at once (the multi-task distilled BiLSTM of table 4.2, line 3), each task its head.
- `BiAttentiveBody` (section 4.1.2, figure 4.2): embeddings -> FFN + ReLU -> BiLSTM -> bi-attention
  -> a second BiLSTM over `[X, X - C, X * C]` -> max, mean and self-attentive pooling of each
  sentence. A single sentence is paired with itself, as the thesis does.

Both embed words with `word_embedding`: one trained table, or with `multichannel` (Kim 2014, which
the thesis follows with word2vec) a second, frozen copy of the pre-trained vectors beside it.

Padding is handled by sequence lengths (an LSTM's state is read after the last real token) and
masks (attention and pooling ignore padded positions). Batches carry sentence a as `input_ids` /
`attention_mask` and sentence b as `input_ids_b` / `attention_mask_b`, without special tokens.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

_NEG = -1e30  # a masked logit: exp underflows to 0 without inf - inf = nan on an all-masked row


class BiLSTM(nn.Module):
  """Outputs of every step [B, L, 2H] and the final states of both directions [B, 2H]."""

  hidden: int

  @nn.compact
  def __call__(self, x_BxLxE, lengths_B):
    # parent=None: each RNN adopts its cell, so parameters read forward/cell/..., backward/cell/...
    forward = nn.RNN(nn.LSTMCell(self.hidden, parent=None), return_carry=True, name="forward")
    backward = nn.RNN(
      nn.LSTMCell(self.hidden, parent=None), return_carry=True, reverse=True, keep_order=True, name="backward"
    )
    (_, h_forward), out_forward = forward(x_BxLxE, seq_lengths=lengths_B)
    (_, h_backward), out_backward = backward(x_BxLxE, seq_lengths=lengths_B)
    return jnp.concatenate([out_forward, out_backward], -1), jnp.concatenate([h_forward, h_backward], -1)


def word_embedding(vocab_size: int, embed_dim: int, multichannel: bool):
  """ids [B, L] -> [B, L, E] from the trained table "embedding", or [B, L, 2E] with `multichannel`:
  the trained table and the frozen "static_embedding" (no gradient reaches it, so every optimiser
  leaves it as initialised) side by side. Kim's CNN applies each filter to both channels and adds
  the results; concatenating them before the LSTM's input weights is the same sum of one linear map
  per channel. Called in a body's compact method: the tables are the body's own parameters."""
  tuned = nn.Embed(vocab_size, embed_dim, name="embedding")
  if not multichannel:
    return tuned
  static = nn.Embed(vocab_size, embed_dim, name="static_embedding")
  return lambda ids: jnp.concatenate([tuned(ids), jax.lax.stop_gradient(static(ids))], -1)


def _sentences(batch):
  """(ids, mask) of sentence a, and of sentence b (a again for a single-sentence batch)."""
  a = (batch["input_ids"], batch["attention_mask"])
  return a, (batch["input_ids_b"], batch["attention_mask_b"]) if "input_ids_b" in batch else a


class BiLSTMBody(nn.Module):
  vocab_size: int
  embed_dim: int = 300
  hidden: int = 150  # 150 or 300 in the thesis
  multichannel: bool = False

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    embed = word_embedding(self.vocab_size, self.embed_dim, self.multichannel)
    encoder = BiLSTM(self.hidden, name="bilstm")
    encode = lambda ids, mask: encoder(embed(ids), mask.sum(-1))[1]
    h1 = encode(batch["input_ids"], batch["attention_mask"])
    if "input_ids_b" not in batch:
      return h1
    h2 = encode(batch["input_ids_b"], batch["attention_mask_b"])
    return jnp.concatenate([h1, h2, h1 * h2, jnp.abs(h1 - h2)], -1)


def _masked_softmax(logits, mask, axis):
  return jax.nn.softmax(jnp.where(mask, logits, _NEG), axis=axis)


class BiAttentiveBody(nn.Module):
  vocab_size: int
  embed_dim: int = 300
  hidden: int = 256  # the thesis's MKD-LSTM
  multichannel: bool = False

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    embed = word_embedding(self.vocab_size, self.embed_dim, self.multichannel)
    ffn = nn.Dense(self.hidden, name="input_ffn")
    encoder, integrator = BiLSTM(self.hidden, name="bilstm"), BiLSTM(self.hidden, name="integrate")
    (ids_x, mask_x), (ids_y, mask_y) = _sentences(batch)
    X = encoder(nn.relu(ffn(embed(ids_x))), mask_x.sum(-1))[0]  # eq. 4.5-4.6: [B, n, 2H]
    Y = encoder(nn.relu(ffn(embed(ids_y))), mask_y.sum(-1))[0]  # [B, m, 2H]
    A = jnp.einsum("bnd,bmd->bnm", X, Y)  # A = X Y^T
    # eq. 4.7, column-wise: A_x = softmax(A) normalises over x's positions, A_y = softmax(A^T) over y's.
    A_x = _masked_softmax(A, mask_x[:, :, None].astype(bool), axis=1)
    A_y = _masked_softmax(A.transpose(0, 2, 1), mask_y[:, :, None].astype(bool), axis=1)
    C_x = jnp.einsum("bnm,bnd->bmd", A_x, X)  # eq. 4.8: A_x^T X, the context of each y token from x
    C_y = jnp.einsum("bmn,bmd->bnd", A_y, Y)  # A_y^T Y, the context of each x token from y
    X_y = integrator(jnp.concatenate([X, X - C_y, X * C_y], -1), mask_x.sum(-1))[0]  # eq. 4.9
    Y_x = integrator(jnp.concatenate([Y, Y - C_x, Y * C_x], -1), mask_y.sum(-1))[0]
    return jnp.concatenate(
      [self._pool(X_y, mask_x, "self_attention_x"), self._pool(Y_x, mask_y, "self_attention_y")], -1
    )

  def _pool(self, h_BxLxD, mask_BxL, name):
    """Eq. 4.10-4.12: [max; mean; self-attentive] over a sentence's real positions."""
    mask = mask_BxL[:, :, None].astype(bool)
    maximum = jnp.max(jnp.where(mask, h_BxLxD, _NEG), axis=1)
    mean = jnp.sum(jnp.where(mask, h_BxLxD, 0), axis=1) / jnp.maximum(mask_BxL.sum(-1, keepdims=True), 1)
    weights = _masked_softmax(nn.Dense(1, name=name)(h_BxLxD), mask, axis=1)  # a = softmax(H v + d)
    return jnp.concatenate([maximum, mean, jnp.sum(weights * h_BxLxD, axis=1)], -1)
