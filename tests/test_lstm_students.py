"""The thesis's BiLSTM students against an independent numpy implementation of the LSTM equations."""

import jax
import jax.numpy as jnp
import numpy as np

from minilm_jax.models.lstm import BiLSTMClassifier, SiameseBiLSTMClassifier

VOCAB, EMBED, HIDDEN, FC, LABELS = 50, 6, 5, 7, 3


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _np_lstm_last(x_LxE, cell):
  """h after running an LSTM over the rows of x: i, f, g, o gates; c = f c + i g; h = o tanh(c)."""
  h = np.zeros(HIDDEN)
  c = np.zeros(HIDDEN)
  gate = lambda name, x, h: x @ np.asarray(cell[f"i{name}"]["kernel"]) + h @ np.asarray(cell[f"h{name}"]["kernel"]) + \
      np.asarray(cell[f"h{name}"]["bias"])
  for x in x_LxE:
    i, f, o = _sigmoid(gate("i", x, h)), _sigmoid(gate("f", x, h)), _sigmoid(gate("o", x, h))
    g = np.tanh(gate("g", x, h))
    c = f * c + i * g
    h = o * np.tanh(c)
  return h


def _np_encode(params, ids, n):
  x = np.asarray(params["embedding"]["embedding"])[ids[:n]]
  forward = _np_lstm_last(x, params["bilstm"]["forward"]["cell"])
  backward = _np_lstm_last(x[::-1], params["bilstm"]["backward"]["cell"])
  return np.concatenate([forward, backward])


def _np_head(params, h):
  dense = lambda name, x: x @ np.asarray(params[name]["kernel"]) + np.asarray(params[name]["bias"])
  return dense("logits", np.maximum(dense("fc", h), 0))


def _batch(seed, lengths, length=9):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, VOCAB, (len(lengths), length))
  mask = (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  return np.where(mask, ids, 0), mask


def test_single_sentence_bilstm_matches_numpy():
  model = BiLSTMClassifier(VOCAB, LABELS, EMBED, HIDDEN, FC)
  ids, mask = _batch(0, [9, 4, 1])
  params = model.init(jax.random.key(0), jnp.asarray(ids), jnp.asarray(mask))["params"]
  got = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask)))
  for b, n in enumerate(mask.sum(1)):
    np.testing.assert_allclose(got[b], _np_head(params, _np_encode(params, ids[b], n)), atol=1e-5)


def test_padding_does_not_change_the_output():
  model = BiLSTMClassifier(VOCAB, LABELS, EMBED, HIDDEN, FC)
  ids, mask = _batch(1, [5, 3], length=5)
  params = model.init(jax.random.key(1), jnp.asarray(ids), jnp.asarray(mask))["params"]
  padded_ids = np.concatenate([ids, np.full((2, 4), 7)], 1)  # garbage ids past the end, masked out
  padded_mask = np.concatenate([mask, np.zeros((2, 4), np.int32)], 1)
  np.testing.assert_allclose(np.asarray(model.apply({"params": params}, jnp.asarray(padded_ids), jnp.asarray(padded_mask))),
                             np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))), atol=1e-6)


def test_siamese_bilstm_matches_numpy_with_shared_weights():
  model = SiameseBiLSTMClassifier(VOCAB, LABELS, EMBED, HIDDEN, FC)
  (ids_a, mask_a), (ids_b, mask_b) = _batch(2, [6, 2]), _batch(3, [3, 9])
  args = [jnp.asarray(a) for a in (ids_a, mask_a, ids_b, mask_b)]
  params = model.init(jax.random.key(2), *args)["params"]
  assert set(params) == {"embedding", "bilstm", "fc", "logits"}  # one encoder for both sentences
  got = np.asarray(model.apply({"params": params}, *args))
  for b in range(2):
    h1 = _np_encode(params, ids_a[b], mask_a[b].sum())
    h2 = _np_encode(params, ids_b[b], mask_b[b].sum())
    np.testing.assert_allclose(got[b], _np_head(params, np.concatenate([h1, h2, h1 * h2, np.abs(h1 - h2)])), atol=1e-5)
