"""Fused attention (`jax.nn.dot_product_attention`) against the explicit softmax path, with padding."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from minilm_jax.models.attention import fused_attention_implementation
from minilm_jax.models.config import exact_gelu
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params

CONFIG = EncoderConfig(
  vocab_size=60,
  hidden_size=32,
  num_layers=2,
  num_heads=4,
  intermediate_size=64,
  initializer_range=0.5,
  hidden_dropout=0.0,
  attention_dropout=0.0,
)
# Rows of different lengths, one of them all padding but its first token.
MASK = np.array([[1] * 11, [1] * 7 + [0] * 4, [1] + [0] * 10])


def _apply(config, params, ids, return_attention, deterministic=True):
  return Encoder(config).apply(
    {"params": params},
    ids,
    jnp.asarray(MASK),
    deterministic=deterministic,
    return_attention=return_attention,
    rngs={"dropout": jax.random.key(3)},
  )


def test_fused_attention_equals_explicit_attention_with_padding():
  params = init_params(CONFIG, jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 60, MASK.shape))
  explicit = _apply(CONFIG, params, ids, return_attention=True)
  fused = _apply(CONFIG, params, ids, return_attention=False)
  assert all(layer.attention is None for layer in fused.layers)
  assert explicit.layers[0].attention.shape == (3, 4, 11, 11)
  for a, b in zip(
    jax.tree.leaves((explicit.last_hidden_state, [(l.q, l.k, l.v) for l in explicit.layers])),
    jax.tree.leaves((fused.last_hidden_state, [(l.q, l.k, l.v) for l in fused.layers])),
  ):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=0)


def test_bfloat16_fused_attention_stays_as_close_to_float32_as_explicit():
  """In bfloat16 the two paths round differently (the fused one keeps its logits in float32), so
  each is held to the float32 result: per-token relative L2 error (measured 0.8% for both)."""
  config = CONFIG.replace(initializer_range=0.1)
  params = init_params(config, jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 60, MASK.shape))
  exact = np.asarray(_apply(config, params, ids, return_attention=True).last_hidden_state)
  for return_attention in (True, False):
    low = _apply(config.replace(dtype="bfloat16"), params, ids, return_attention).last_hidden_state
    error = np.linalg.norm(np.asarray(low, np.float32) - exact, axis=-1) / np.linalg.norm(exact, axis=-1)
    assert error.max() < 0.02, (return_attention, error.max())


def test_fused_attention_gradients_equal_explicit_ones():
  """Training without attention dropout takes the fused path: its gradients are the explicit path's."""
  params = init_params(CONFIG, jax.random.key(1))
  ids = jnp.asarray(np.random.default_rng(1).integers(1, 60, MASK.shape))

  def loss(p, return_attention):
    out = _apply(CONFIG, p, ids, return_attention, deterministic=False)
    return jnp.sum(out.last_hidden_state * MASK[..., None] ** 2) + jnp.sum(out.layers[-1].v ** 2)

  grad = jax.jit(jax.grad(loss), static_argnums=1)  # one program each, not op by op
  explicit = traverse_util.flatten_dict(grad(params, True), sep="/")
  fused = traverse_util.flatten_dict(grad(params, False), sep="/")
  for name in explicit:
    # The key bias's exact gradient is 0 (softmax ignores q.b): both paths give rounding noise there.
    if not name.endswith("key/bias"):
      np.testing.assert_allclose(
        np.asarray(explicit[name]), np.asarray(fused[name]), atol=1e-4, rtol=1e-4, err_msg=name
      )


def test_attention_dropout_paths_drop_the_same_entries_and_have_the_same_gradient():
  """With attention dropout in training, the rematerialised path (probabilities not returned) and
  the explicit one (returned) drop the same entries: equal outputs and equal parameter gradients;
  at evaluation the fused path runs and nothing is dropped."""
  config = CONFIG.replace(attention_dropout=0.3)
  params = init_params(config, jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 60, MASK.shape))

  def loss(params, return_attention):
    out = _apply(config, params, ids, return_attention=return_attention, deterministic=False)
    return jnp.sum(out.last_hidden_state * jnp.cos(jnp.arange(config.hidden_size)))

  (remat, remat_grad), (explicit, explicit_grad) = (
    jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, return_attention) for return_attention in (False, True)
  )
  np.testing.assert_allclose(remat, explicit, rtol=1e-6)
  # The same entries dropped; float32 rounding in another order of operations (initializer_range 0.5).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4), remat_grad, explicit_grad)
  evaluated = _apply(config, params, ids, return_attention=False).last_hidden_state
  trained = _apply(config, params, ids, return_attention=False, deterministic=False).last_hidden_state
  assert not np.allclose(np.asarray(trained), np.asarray(evaluated))


def test_cudnn_is_chosen_only_for_half_precision_on_gpus():
  on_gpu = jax.default_backend() == "gpu"
  assert fused_attention_implementation(jnp.float32, 64) == "xla"
  assert fused_attention_implementation(jnp.bfloat16, 64) == ("cudnn" if on_gpu else "xla")
  assert fused_attention_implementation(jnp.bfloat16, 12) == "xla"


def test_exact_gelu_is_flaxs_erfc_form_to_rounding():
  """BERT's GELU written with erf (it fuses whole on GPUs; PyTorch's BERT writes it so too) equals
  `nn.gelu(approximate=False)` (erfc) to float32 rounding: 1 + erf(x / sqrt 2) cancels for x < -5,
  where the value is below 1e-6 anyway; and to bfloat16's where the model computes in it."""
  import flax.linen as nn

  x = jnp.linspace(-12.0, 12.0, 20001, dtype=jnp.float32)
  np.testing.assert_allclose(exact_gelu(x), nn.gelu(x, approximate=False), rtol=1e-6, atol=1e-6)
  half = x.astype(jnp.bfloat16)
  np.testing.assert_allclose(
    exact_gelu(half).astype(jnp.float32), nn.gelu(half, approximate=False).astype(jnp.float32), rtol=2e-2, atol=1e-2
  )


def test_sliding_layers_attend_by_blocks_without_an_l_by_l_array_and_train_as_the_dense_window():
  """ModernBERT's sliding layers on the fused path (`attention.local_attention`): no [.., L, L] array
  anywhere in the traced encoder (every layer sliding), and the same outputs and gradients as the
  explicit path's dense scores under the window, at lengths that are and are not a multiple of
  the blocks (half the window)."""
  config = EncoderConfig.of_type(
    "modernbert", vocab_size=60, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48, local_window=4
  ).replace(sliding_layers=(0, 1), initializer_range=0.5, hidden_dropout=0.0, attention_dropout=0.0)
  params = jax.jit(init_params, static_argnums=0)(config, jax.random.key(2))
  for length in (11, 12):
    ids = jnp.asarray(np.random.default_rng(length).integers(1, 60, (3, length)))
    mask = jnp.asarray(np.arange(length)[None] < np.array([length, 7, 1])[:, None]).astype(jnp.int32)

    def loss(p, return_attention, ids=ids, mask=mask):
      out = Encoder(config).apply({"params": p}, ids, mask, deterministic=False, return_attention=return_attention)
      return jnp.sum(out.last_hidden_state * mask[..., None] * jnp.cos(jnp.arange(32))), out

    jaxpr = jax.make_jaxpr(lambda p: loss(p, False)[0])(params)
    shapes = [v.aval.shape for eqn in jaxpr.eqns for v in eqn.outvars if hasattr(v.aval, "shape")]
    assert not [s for s in shapes if s[-2:] == (length, length)], "a sliding layer held [L, L]"
    # Jitted: eagerly, each of the passes' operations compiles apart (400 compiles, most of the test's time).
    value_and_grad = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    (dense_loss, dense), dense_grads = value_and_grad(params, True)
    (local_loss, local), local_grads = value_and_grad(params, False)
    rows = np.asarray(mask, bool)
    np.testing.assert_allclose(local.last_hidden_state[rows], dense.last_hidden_state[rows], atol=2e-5)
    # The loss sums some 600 terms of order 1 to about 0.6: their rounding (each state within 2e-5)
    # is bounded absolutely; a relative bound on the cancelled sum failed on an AMD EPYC (1.1e-5).
    np.testing.assert_allclose(local_loss, dense_loss, atol=1e-4)
    for name, want in traverse_util.flatten_dict(dense_grads, sep="/").items():
      got = traverse_util.flatten_dict(local_grads, sep="/")[name]
      np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=name)
    assert float(jnp.max(dense.layers[0].attention[0, :, 0, 3:])) == 0.0  # 3 apart: outside the window of 4


def test_parameter_shapes_are_traced_once_per_config_and_each_caller_gets_its_own_tree(monkeypatch):
  """A run asks for its models' shapes while it loads, builds, restores and exports: one trace of
  the init per config (and per head), every answer a tree the caller may change."""
  from minilm_jax.models import encoder, heads

  traced = []
  real_init = encoder.init_params
  monkeypatch.setattr(encoder, "init_params", lambda config, rng: traced.append(config) or real_init(config, rng))
  config = EncoderConfig(vocab_size=97, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16)
  first = encoder.abstract_params(config)
  first["embeddings"] = None  # the caller's own tree
  second = encoder.abstract_params(config)
  assert second["embeddings"]["word_embeddings"]["embedding"].shape == (97, 8)
  assert encoder.abstract_params(config.replace(hidden_size=12))["embeddings"]["word_embeddings"][
    "embedding"
  ].shape == (97, 12)
  assert traced == [config, config.replace(hidden_size=12)]
  # A task model's shapes, by head: the same head described again (another dict) is not traced again.
  traced_heads = []
  real_task_init = heads.init_task_params
  monkeypatch.setattr(heads, "init_task_params", lambda c, h, rng: traced_heads.append(h) or real_task_init(c, h, rng))
  head = {"kind": "classification", "num_labels": 3}
  a, b = heads.abstract_model_params(config, head), heads.abstract_model_params(config, dict(reversed(head.items())))
  assert a == b and a is not b and a["classifier"]["kernel"].shape == (8, 3)
  assert heads.abstract_model_params(config, {**head, "num_labels": 5})["classifier"]["kernel"].shape == (8, 5)
  assert traced_heads == [head, {**head, "num_labels": 5}]
