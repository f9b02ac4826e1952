"""MiniLM losses against an independent numpy reference written from the paper's equations (6)-(10)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minilm_jax.errors import UserError
from minilm_jax.models.encoder import LayerOutput
from minilm_jax.transfer import relations


def _np_relation(x_h_l_k, y_h_l_k, valid, num_rel):
  """x, y: one example's projection [heads, length, head_dim]; only the `valid` (real) tokens exist."""
  heads, length, k = x_h_l_k.shape
  x = x_h_l_k.transpose(1, 0, 2).reshape(length, heads * k)[valid].astype(np.float64)
  y = y_h_l_k.transpose(1, 0, 2).reshape(length, heads * k)[valid].astype(np.float64)
  d = heads * k // num_rel
  out = []
  for a in range(num_rel):
    s = x[:, a * d : (a + 1) * d] @ y[:, a * d : (a + 1) * d].T / np.sqrt(d)
    s = s - s.max(-1, keepdims=True)
    out.append(np.exp(s) / np.exp(s).sum(-1, keepdims=True))
  return np.stack(out)  # [A_r, |x|, |x|]


def _np_loss(teacher, student, mask, rel, num_rel):
  total = 0.0
  for j in range(mask.shape[0]):
    valid = mask[j].astype(bool)
    p = _np_relation(teacher[rel[0]][j], teacher[rel[1]][j], valid, num_rel)
    q = _np_relation(student[rel[0]][j], student[rel[1]][j], valid, num_rel)
    kl = (p * (np.log(p) - np.log(q))).sum()  # sum over heads, query tokens, keys
    total += kl / (num_rel * valid.sum())  # 1 / (A_h |x|), eq. 6 and 9
  return total / mask.shape[0]


def _random_layer(rng, batch, heads, length, head_dim, scale=1.0):
  return {n: scale * rng.standard_normal((batch, heads, length, head_dim)).astype(np.float32) for n in "qkv"}


def _layer(d):
  return LayerOutput(q=jnp.asarray(d["q"]), k=jnp.asarray(d["k"]), v=jnp.asarray(d["v"]), attention=None, hidden=None)


MASK = np.array([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7])


@pytest.mark.parametrize(
  "teacher_shape,student_shape,num_rel,spec",
  [
    ((12, 8), (12, 4), 12, "minilm"),  # v1: same head count, student narrower
    ((12, 8), (6, 4), 4, "minilm"),  # relation heads differ from both head counts
    ((12, 8), (4, 12), 48, "minilmv2"),  # MiniLMv2's 48 relation heads
    ((4, 6), (2, 6), 3, "qk,vv,kq"),
  ],
)
def test_loss_matches_numpy_reference(teacher_shape, student_shape, num_rel, spec):
  rng = np.random.default_rng(0)
  t = _random_layer(rng, 3, *teacher_shape[:1], 9, teacher_shape[1], scale=2.0)
  s = _random_layer(rng, 3, *student_shape[:1], 9, student_shape[1])
  rels = relations.parse_relations(spec)
  got = relations.minilm_loss(_layer(t), _layer(s), jnp.asarray(MASK), rels, num_rel)
  assert set(got) == set(rels)
  for rel in rels:
    np.testing.assert_allclose(float(got[rel]), _np_loss(t, s, MASK, rel, num_rel), rtol=2e-5)


def test_qk_relation_with_head_count_is_the_attention_distribution():
  """In v1 mode the qk relation equals the encoder's attention probabilities."""
  from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params

  config = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, intermediate_size=64)
  params = init_params(config, jax.random.key(1))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 50, (3, 9)))
  out = Encoder(config).apply({"params": params}, ids, jnp.asarray(MASK), return_attention=True)
  layer = out.layers[0]
  logp = relations.relation_log_probs(layer.q, layer.k, jnp.asarray(MASK), 4)
  np.testing.assert_allclose(np.exp(np.asarray(logp)), np.asarray(layer.attention), atol=1e-6)


def test_loss_is_zero_when_student_is_teacher():
  rng = np.random.default_rng(1)
  t = _layer(_random_layer(rng, 3, 12, 9, 8))
  for rel, value in relations.minilm_loss(t, t, jnp.asarray(MASK), ("qk", "vv", "qq"), 12).items():
    assert float(value) == 0.0, rel


def test_padding_does_not_change_the_loss():
  """Extra padding tokens (any values) leave the loss as it was."""
  rng = np.random.default_rng(2)
  t, s = _random_layer(rng, 1, 4, 5, 8), _random_layer(rng, 1, 4, 5, 8)
  base = relations.minilm_loss(_layer(t), _layer(s), jnp.ones((1, 5)), ("qk", "vv"), 4)
  pad = lambda d: {
    n: np.concatenate([x, 100 * rng.standard_normal((1, 4, 3, 8)).astype(np.float32)], 2) for n, x in d.items()
  }
  padded = relations.minilm_loss(_layer(pad(t)), _layer(pad(s)), jnp.asarray([[1] * 5 + [0] * 3]), ("qk", "vv"), 4)
  for rel in base:
    np.testing.assert_allclose(float(padded[rel]), float(base[rel]), rtol=1e-6)


def test_gradients_flow_only_into_the_student():
  rng = np.random.default_rng(3)
  t, s = _layer(_random_layer(rng, 2, 4, 5, 8)), _layer(_random_layer(rng, 2, 4, 5, 8))
  mask = jnp.ones((2, 5))

  def total(teacher, student):
    return sum(relations.minilm_loss(teacher, student, mask, ("qk", "vv"), 4).values())

  g_teacher, g_student = jax.grad(total, argnums=(0, 1))(t, s)
  for name in "qkv":
    assert float(jnp.abs(getattr(g_teacher, name)).max()) == 0.0
    assert float(jnp.abs(getattr(g_student, name)).max()) > 0.0


def test_bfloat16_inputs_are_computed_in_float32():
  rng = np.random.default_rng(4)
  t, s = _random_layer(rng, 2, 4, 5, 8), _random_layer(rng, 2, 4, 5, 8)
  low = lambda d: LayerOutput(**{n: jnp.asarray(x, jnp.bfloat16) for n, x in d.items()}, attention=None, hidden=None)
  got = relations.minilm_loss(low(t), low(s), jnp.ones((2, 5)), ("qk",), 4)["qk"]
  assert got.dtype == jnp.float32
  rounded = {n: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for n, x in t.items()}
  rounded_s = {n: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for n, x in s.items()}
  np.testing.assert_allclose(float(got), _np_loss(rounded, rounded_s, np.ones((2, 5)), "qk", 4), rtol=1e-5)


def test_bad_relation_specs_are_one_line_errors():
  with pytest.raises(UserError, match="not understood"):
    relations.parse_relations("qx")
  with pytest.raises(UserError, match="does not divide hidden size 384"):
    relations.check_relation_heads(256, 768, 384)


@pytest.mark.parametrize("query_chunk", [1, 4, 9, 16])  # 4 leaves a partial last chunk of 9 rows
def test_chunked_loss_equals_full_loss_and_gradient(query_chunk):
  rng = np.random.default_rng(5)
  t = _layer(_random_layer(rng, 3, 12, 9, 8, scale=2.0))
  s = _layer(_random_layer(rng, 3, 6, 9, 8))
  mask = jnp.asarray(MASK)

  def total(student, chunk):
    return sum(relations.minilm_loss(t, student, mask, ("qk", "vv", "kk"), 4, query_chunk=chunk).values())

  full, full_grad = jax.value_and_grad(total)(s, 0)
  chunked, chunked_grad = jax.jit(jax.value_and_grad(total), static_argnums=1)(s, query_chunk)
  np.testing.assert_allclose(float(chunked), float(full), rtol=1e-6)
  for name in "qkv":
    np.testing.assert_allclose(
      np.asarray(getattr(chunked_grad, name)), np.asarray(getattr(full_grad, name)), atol=1e-7, rtol=1e-5
    )
