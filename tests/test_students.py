"""The thesis's students against independent implementations: numpy LSTM equations, bi-attention
and pooling as the thesis writes them (eq. 4.5-4.12), and transformers' BertModel for the
3-layer Transformer student."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from minilm_jax.errors import UserError
from minilm_jax.models.students import make_student

VOCAB, EMBED, HIDDEN, FC, LABELS = 50, 6, 5, 7, 3


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _np_lstm(x_LxE, cell):
  """Hidden state after each row of x: i, f, g, o gates; c = f c + i g; h = o tanh(c)."""
  h, c, out = np.zeros(HIDDEN), np.zeros(HIDDEN), []
  gate = lambda name, x, h: (
    x @ np.asarray(cell[f"i{name}"]["kernel"])
    + h @ np.asarray(cell[f"h{name}"]["kernel"])
    + np.asarray(cell[f"h{name}"]["bias"])
  )
  for x in x_LxE:
    i, f, o = _sigmoid(gate("i", x, h)), _sigmoid(gate("f", x, h)), _sigmoid(gate("o", x, h))
    c = f * c + i * np.tanh(gate("g", x, h))
    h = o * np.tanh(c)
    out.append(h)
  return np.stack(out)


def _np_bilstm(params, x_LxE):
  """([L, 2H] outputs, [2H] final states) of a BiLSTM over the rows of x (real tokens only)."""
  forward = _np_lstm(x_LxE, params["forward"]["cell"])
  backward = _np_lstm(x_LxE[::-1], params["backward"]["cell"])[::-1]
  return np.concatenate([forward, backward], -1), np.concatenate([forward[-1], backward[0]])


def _dense(params, x):
  return x @ np.asarray(params["kernel"]) + np.asarray(params["bias"])


def _np_head(params, features):
  return _dense(params["logits"], np.maximum(_dense(params["fc"], features), 0))


def _softmax(x, axis):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def _batch(seed, lengths, length=9):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, VOCAB, (len(lengths), length))
  mask = (np.arange(length)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  return np.where(mask, ids, 0), mask


def _student(kind, **fields):
  c = ml_collections.ConfigDict({"kind": kind, "embed_dim": EMBED, "hidden": HIDDEN, "fc": FC, **fields})
  return make_student(c, (("task", LABELS),), VOCAB)


def _run(model, batch, seed=0):
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  params = jax.jit(model.init, static_argnums=2)(jax.random.key(seed), batch, "task")["params"]
  return params, np.asarray(jax.jit(model.apply, static_argnums=2)({"params": params}, batch, "task"))


def test_single_sentence_bilstm_matches_numpy():
  ids, mask = _batch(0, [9, 4, 1])
  params, got = _run(_student("bilstm"), {"input_ids": ids, "attention_mask": mask})
  body = params["body"]
  for b, n in enumerate(mask.sum(1)):
    h = _np_bilstm(body["bilstm"], np.asarray(body["embedding"]["embedding"])[ids[b, :n]])[1]
    np.testing.assert_allclose(got[b], _np_head(params["head_task"], h), atol=1e-5)


def test_padding_does_not_change_the_output():
  model = _student("biattentive")
  ids, mask = _batch(1, [5, 3], length=5)
  params, short = _run(model, {"input_ids": ids, "attention_mask": mask})
  padded = {
    "input_ids": np.concatenate([ids, np.full((2, 4), 7)], 1),  # garbage ids past the end, masked out
    "attention_mask": np.concatenate([mask, np.zeros((2, 4), np.int32)], 1),
  }
  long = jax.jit(model.apply, static_argnums=2)(
    {"params": params}, {k: jnp.asarray(v) for k, v in padded.items()}, "task"
  )
  np.testing.assert_allclose(np.asarray(long), short, atol=1e-5)


@pytest.mark.parametrize("kind", ["bilstm", "siamese_bilstm"])  # the second: the name older runs use
def test_bilstm_on_pairs_matches_siamese_numpy_with_shared_weights(kind):
  (ids_a, mask_a), (ids_b, mask_b) = _batch(2, [6, 2]), _batch(3, [3, 9])
  params, got = _run(
    _student(kind),
    {"input_ids": ids_a, "attention_mask": mask_a, "input_ids_b": ids_b, "attention_mask_b": mask_b},
  )
  body = params["body"]
  assert set(body) == {"embedding", "bilstm"}  # one encoder for both sentences
  embedding = np.asarray(body["embedding"]["embedding"])
  for b in range(2):
    h1 = _np_bilstm(body["bilstm"], embedding[ids_a[b, : mask_a[b].sum()]])[1]
    h2 = _np_bilstm(body["bilstm"], embedding[ids_b[b, : mask_b[b].sum()]])[1]
    np.testing.assert_allclose(
      got[b], _np_head(params["head_task"], np.concatenate([h1, h2, h1 * h2, np.abs(h1 - h2)])), atol=1e-5
    )


def _np_biattentive(body, ids_x, ids_y):
  """Thesis eq. 4.5-4.12 for one (unpadded) pair, written from the equations."""
  embedding = np.asarray(body["embedding"]["embedding"])
  w = lambda ids: np.maximum(_dense(body["input_ffn"], embedding[ids]), 0)
  X, Y = _np_bilstm(body["bilstm"], w(ids_x))[0], _np_bilstm(body["bilstm"], w(ids_y))[0]  # [n, 2H], [m, 2H]
  A = X @ Y.T
  A_x, A_y = _softmax(A, axis=0), _softmax(A.T, axis=0)  # column-wise normalisation
  C_x, C_y = A_x.T @ X, A_y.T @ Y  # [m, 2H], [n, 2H]
  X_y = _np_bilstm(body["integrate"], np.concatenate([X, X - C_y, X * C_y], -1))[0]
  Y_x = _np_bilstm(body["integrate"], np.concatenate([Y, Y - C_x, Y * C_x], -1))[0]

  def pool(H, attention):
    a = _softmax(_dense(attention, H)[:, 0], axis=0)
    return np.concatenate([H.max(0), H.mean(0), H.T @ a])

  return np.concatenate([pool(X_y, body["self_attention_x"]), pool(Y_x, body["self_attention_y"])])


def test_biattentive_lstm_matches_the_thesis_equations():
  (ids_a, mask_a), (ids_b, mask_b) = _batch(4, [7, 3, 9]), _batch(5, [4, 9, 2])
  params, got = _run(
    _student("biattentive"),
    {"input_ids": ids_a, "attention_mask": mask_a, "input_ids_b": ids_b, "attention_mask_b": mask_b},
    seed=1,
  )
  for b in range(3):
    features = _np_biattentive(params["body"], ids_a[b, : mask_a[b].sum()], ids_b[b, : mask_b[b].sum()])
    np.testing.assert_allclose(got[b], _np_head(params["head_task"], features), atol=2e-5)


def test_biattentive_lstm_pairs_a_single_sentence_with_itself():
  ids, mask = _batch(6, [5, 8])
  params, single = _run(_student("biattentive"), {"input_ids": ids, "attention_mask": mask})
  for b in range(2):
    x = ids[b, : mask[b].sum()]
    np.testing.assert_allclose(
      single[b], _np_head(params["head_task"], _np_biattentive(params["body"], x, x)), atol=2e-5
    )


@pytest.mark.slow
def test_transformer_student_averages_cls_of_the_teachers_first_layers(minilm_dir, minilm):
  import torch
  import transformers

  from conftest import SENTENCES
  from minilm_jax.task_distill.run import transformer_init

  model, teacher_params, tokenizer = minilm
  student = make_student(
    ml_collections.ConfigDict({"kind": "transformer", "num_layers": 3, "dropout": 0.1, "fc": FC}),
    (("task", LABELS),),
    model.config.vocab_size,
    model.config,
  )
  enc = tokenizer(SENTENCES[:2], SENTENCES[2:], padding=True, return_tensors="np")
  batch = {k: jnp.asarray(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
  params = student.init(jax.random.key(0), batch, "task")["params"]
  params = {**params, "body": transformer_init(teacher_params, 3)}
  features = student.apply({"params": params}, batch, method=lambda m, b: m.body(b))
  with torch.no_grad():
    hf_model = transformers.BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    hidden = hf_model(**{k: torch.tensor(v) for k, v in enc.items()}, output_hidden_states=True).hidden_states
  expected = torch.stack([h[:, 0] for h in hidden[1:4]]).mean(0).numpy()
  np.testing.assert_allclose(np.asarray(features), expected, atol=1e-4)
  assert set(params["body"]["encoder"]) == {"embeddings", "layer_0", "layer_1", "layer_2", "pooler"}


def test_unknown_student_kind_is_one_line():
  with pytest.raises(UserError, match="student.kind='gru'"):
    _student("gru")
