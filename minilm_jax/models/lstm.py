"""Small task-specific students of the thesis (chapter 3): the distilled BiLSTM.

Single sentence (figure 3.1): word embeddings -> one BiLSTM -> the last hidden state of each
direction, concatenated -> Dense + ReLU -> logits. Sentence pairs (figure 3.2): one BiLSTM shared by
both sentences (siamese) -> concatenate-compare [h1, h2, h1 * h2, |h1 - h2|] -> Dense + ReLU ->
logits. Padding is handled by sequence lengths: the forward state is read after the last real
token, the backward state after the first.
"""

import flax.linen as nn
import jax.numpy as jnp


class BiLSTMEncoder(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x_BxLxE, lengths_B):
    # parent=None: each RNN adopts its cell, so parameters read forward/cell/..., backward/cell/...
    forward = nn.RNN(nn.LSTMCell(self.hidden, parent=None), return_carry=True, name="forward")
    backward = nn.RNN(nn.LSTMCell(self.hidden, parent=None), return_carry=True, reverse=True, keep_order=True,
                      name="backward")
    (_, h_forward), _ = forward(x_BxLxE, seq_lengths=lengths_B)
    (_, h_backward), _ = backward(x_BxLxE, seq_lengths=lengths_B)
    return jnp.concatenate([h_forward, h_backward], axis=-1)


class _BiLSTMStudent(nn.Module):
  """Sizes shared by both students: hidden 150 or 300 and fc 200 or 400 in the thesis."""

  vocab_size: int
  num_labels: int
  embed_dim: int = 300
  hidden: int = 150
  fc: int = 200


class BiLSTMClassifier(_BiLSTMStudent):
  """Logits [batch, num_labels] of one sentence."""

  @nn.compact
  def __call__(self, input_ids, attention_mask):
    x = nn.Embed(self.vocab_size, self.embed_dim, name="embedding")(input_ids)
    h = BiLSTMEncoder(self.hidden, name="bilstm")(x, attention_mask.sum(-1))
    return nn.Dense(self.num_labels, name="logits")(nn.relu(nn.Dense(self.fc, name="fc")(h)))


class SiameseBiLSTMClassifier(_BiLSTMStudent):
  """Logits [batch, num_labels] of a sentence pair, both sentences through the same embedding and BiLSTM."""

  @nn.compact
  def __call__(self, ids_a, mask_a, ids_b, mask_b):
    embed = nn.Embed(self.vocab_size, self.embed_dim, name="embedding")
    encoder = BiLSTMEncoder(self.hidden, name="bilstm")
    h1, h2 = encoder(embed(ids_a), mask_a.sum(-1)), encoder(embed(ids_b), mask_b.sum(-1))
    compared = jnp.concatenate([h1, h2, h1 * h2, jnp.abs(h1 - h2)], axis=-1)
    return nn.Dense(self.num_labels, name="logits")(nn.relu(nn.Dense(self.fc, name="fc")(compared)))
