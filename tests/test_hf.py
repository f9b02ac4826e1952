"""The encoder against Hugging Face transformers (PyTorch, eager attention) on real and random checkpoints."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from conftest import SENTENCES
from minilm_jax.errors import UserError
from minilm_jax.models import hf
from minilm_jax.models.encoder import Encoder


def _load(path):
  """(Encoder, params) of a Hugging Face directory."""
  loaded = hf.load(path)
  return Encoder(loaded.config), loaded.params


def _ours(model, params, batch, return_attention=True):
  return model.apply(
    {"params": params},
    *(jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask", "token_type_ids")),
    return_attention=return_attention,
  )


def _theirs(model_dir, batch, dtype=torch.float32):
  model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval().to(dtype)
  with torch.no_grad():
    return model(**{k: torch.tensor(v) for k, v in batch.items()}, output_attentions=True)


def _assert_parity(ours, theirs, mask, hidden_tol=1e-4, attention_tol=1e-5):
  rows = mask.astype(bool)
  np.testing.assert_allclose(
    np.asarray(ours.last_hidden_state)[rows], theirs.last_hidden_state.numpy()[rows], atol=hidden_tol, rtol=0
  )
  assert len(ours.layers) == len(theirs.attentions)
  for layer, ref in zip(ours.layers, theirs.attentions):
    a, b = np.asarray(layer.attention), ref.numpy()
    for j in range(len(rows)):  # only the rows (queries) of real tokens are defined the same way
      np.testing.assert_allclose(a[j][:, rows[j]], b[j][:, rows[j]], atol=attention_tol, rtol=0)


def test_real_minilm_matches_transformers(minilm, minilm_dir):
  model, params, tokenizer = minilm
  batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="np"))
  lengths = batch["attention_mask"].sum(1)
  assert len(set(lengths)) == len(SENTENCES), "the batch must mix lengths so padding is exercised"
  ours = _ours(model, params, batch)
  theirs = _theirs(minilm_dir, batch)
  _assert_parity(ours, theirs, batch["attention_mask"])
  # Every position, padding included, against float64: two float32 implementations each sit ~5e-5 from
  # the exact value after 6 layers (hidden states reach 10), so float64 is the fair judge of padded rows.
  exact = _theirs(minilm_dir, batch, torch.float64).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(ours.last_hidden_state), exact, atol=1e-4, rtol=0)
  layer = ours.layers[0]
  b, length = batch["input_ids"].shape
  assert layer.q.shape == layer.k.shape == layer.v.shape == (b, 12, length, 32)
  assert layer.attention.shape == (b, 12, length, length)
  # Without probabilities the layers run fused attention, held to the same bounds.
  fused = _ours(model, params, batch, return_attention=False)
  assert all(layer.attention is None for layer in fused.layers)
  rows = batch["attention_mask"].astype(bool)
  np.testing.assert_allclose(
    np.asarray(fused.last_hidden_state)[rows], theirs.last_hidden_state.numpy()[rows], atol=1e-4, rtol=0
  )
  np.testing.assert_allclose(np.asarray(fused.last_hidden_state), exact, atol=1e-4, rtol=0)


def test_tokenizer_does_not_inherit_padding_to_128(minilm):
  *_, tokenizer = minilm
  ids = tokenizer(["short"])["input_ids"][0]
  assert len(ids) == 3  # [CLS] short [SEP], not padded to 128
  long = tokenizer([" ".join(["word"] * 300)])["input_ids"][0]
  assert len(long) == 302  # not truncated either


def _random_hf_checkpoint(tmp_path, model_type):
  cls, cfg_cls = {
    "roberta": (transformers.RobertaModel, transformers.RobertaConfig),
    "xlm-roberta": (transformers.XLMRobertaModel, transformers.XLMRobertaConfig),
    "bert": (transformers.BertModel, transformers.BertConfig),
  }[model_type]
  torch.manual_seed(0)
  config = cfg_cls(
    vocab_size=120,
    hidden_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=64,
    type_vocab_size=1 if model_type != "bert" else 2,
    pad_token_id=1,
    layer_norm_eps=1e-5,
  )
  return _saved_perturbed(cls(config), str(tmp_path / model_type))


def _saved_perturbed(model, path: str) -> str:
  """`model` saved at `path` as transformers saves it, its parameters perturbed first: random init
  leaves LayerNorm at identity and biases at zero, and the mapping must be checked on every one."""
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(path)
  return path


def _random_batch(pad_token_id=1, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, 120, size=(3, 11))
  lengths = [11, 7, 4]
  mask = np.zeros_like(ids)
  for j, n in enumerate(lengths):
    mask[j, :n] = 1
    ids[j, n:] = pad_token_id
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_random_roberta_family_matches_transformers(tmp_path, model_type):
  path = _random_hf_checkpoint(tmp_path, model_type)
  model, params = _load(path)
  assert model.config.model_type == model_type and model.config.position_offset == 2
  batch = _random_batch()
  _assert_parity(_ours(model, params, batch), _theirs(path, batch), batch["attention_mask"])


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_save_round_trip_through_transformers(tmp_path, model_type):
  src = _random_hf_checkpoint(tmp_path, model_type)
  model, params = _load(src)
  out = str(tmp_path / "exported")
  hf.save(out, model.config, params)
  batch = _random_batch()
  original, exported = _theirs(src, batch), _theirs(out, batch)
  np.testing.assert_allclose(exported.last_hidden_state.numpy(), original.last_hidden_state.numpy(), atol=1e-6)
  np.testing.assert_allclose(exported.pooler_output.numpy(), original.pooler_output.numpy(), atol=1e-6)
  # And our loader reads our own export back to the same parameters.
  again = hf.load(out).params
  jax.tree.map(np.testing.assert_array_equal, params, again)


def test_save_writes_tokenizer_files(tmp_path, minilm):
  model, params, tokenizer = minilm
  out = str(tmp_path / "with_tokenizer")
  hf.save(out, model.config, params, tokenizer=tokenizer)
  assert os.path.exists(os.path.join(out, "tokenizer.json"))
  reloaded = hf.load_tokenizer(out)
  assert reloaded(SENTENCES)["input_ids"] == tokenizer(SENTENCES)["input_ids"]


def test_bfloat16_compute_stays_close_to_float32(minilm):
  """bfloat16 keeps 8 mantissa bits (relative step 2^-8 ~ 0.4%). Rounding every matmul input through
  6 layers moves a token's hidden state by ~2% of its norm (measured 2.1%) and attention logits by
  ~0.1, so single probabilities move by up to ~0.05 (measured 0.046). We bound what distillation uses:
  per-token relative L2 error < 5%, cosine > 0.999 (measured 0.99987), and per-row
  KL(float32 || bfloat16) of every layer's attention < 5e-3 (measured 6e-4). Parameters stay float32."""
  model, params, tokenizer = minilm
  batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="np"))
  ref = _ours(model, params, batch)
  low = _ours(model.__class__(model.config.replace(dtype="bfloat16")), params, batch)
  assert low.last_hidden_state.dtype == jnp.bfloat16 and low.layers[0].attention.dtype == jnp.float32
  rows = batch["attention_mask"].astype(bool)
  a = np.asarray(ref.last_hidden_state, np.float64)[rows]
  b = np.asarray(low.last_hidden_state.astype(jnp.float32), np.float64)[rows]
  assert (np.linalg.norm(a - b, axis=-1) / np.linalg.norm(a, axis=-1)).max() < 0.05
  assert ((a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)).min() > 0.999
  for x, y in zip(ref.layers, low.layers):
    p = np.asarray(x.attention, np.float64).transpose(0, 2, 1, 3)[rows]  # [real tokens, heads, keys]
    q = np.asarray(y.attention, np.float64).transpose(0, 2, 1, 3)[rows]
    kl = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1)) - np.log(np.maximum(q, 1e-30))), 0).sum(-1)
    assert kl.max() < 5e-3, kl.max()


def test_missing_directory_is_one_line_error(tmp_path):
  with pytest.raises(UserError, match="does not exist"):
    hf.load(str(tmp_path / "nope"))


def test_directory_without_weights(tmp_path, minilm_dir):
  d = tmp_path / "noweights"
  d.mkdir()
  (d / "config.json").write_text(open(os.path.join(minilm_dir, "config.json")).read())
  with pytest.raises(UserError, match="no weights"):
    hf.load(str(d))


def test_unsupported_model_type(tmp_path):
  d = tmp_path / "gpt"
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(UserError, match="unsupported model_type 'gpt2'"):
    hf.load(str(d))


def test_weights_that_do_not_fit_the_config(tmp_path):
  src = _random_hf_checkpoint(tmp_path, "bert")
  cfg = json.load(open(os.path.join(src, "config.json")))
  cfg["intermediate_size"] = 80
  json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
  with pytest.raises(UserError, match="intermediate.dense.weight has shape"):
    hf.load(src)


def test_pytorch_bin_loads_through_weights_only(tmp_path):
  src = _random_hf_checkpoint(tmp_path, "bert")
  expected = hf.load(src).params
  state = transformers.AutoModel.from_pretrained(src).state_dict()
  os.remove(os.path.join(src, "model.safetensors"))
  torch.save({"bert." + k: v for k, v in state.items()}, os.path.join(src, "pytorch_model.bin"))
  params = hf.load(src).params
  np.testing.assert_array_equal(
    np.asarray(params["layer_1"]["output"]["kernel"]), np.asarray(expected["layer_1"]["output"]["kernel"])
  )


def _random_model(tmp_path, architecture: str, **fields):
  """A random transformers `<architecture>Model`, 48 wide with 4 heads (2 layers unless `fields` say
  otherwise), as transformers writes it, its LayerNorms and biases perturbed off identity."""
  torch.manual_seed(0)
  config = getattr(transformers, f"{architecture}Config")(
    vocab_size=120, hidden_size=48, num_attention_heads=4, intermediate_size=96, **{"num_hidden_layers": 2, **fields}
  )
  return _saved_perturbed(getattr(transformers, f"{architecture}Model")(config), str(tmp_path / architecture.lower()))


def _random_mpnet(tmp_path, **overrides):
  return _random_model(tmp_path, "MPNet", max_position_embeddings=300, pad_token_id=1, **overrides)


def test_mpnet_relative_position_buckets_are_transformers():
  """Every relative position up to 600 apart falls in transformers' MPNet bucket (its float32
  logarithm's boundaries included)."""
  from minilm_jax.models.mpnet import relative_position_buckets

  length = 601
  relative = torch.arange(length)[None, :] - torch.arange(length)[:, None]
  theirs = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(relative).numpy()
  np.testing.assert_array_equal(relative_position_buckets(length), theirs)


def test_random_mpnet_matches_transformers_and_exports_as_mpnet(tmp_path):
  """An MPNet checkpoint transformers wrote loads with parity on padded batches of several lengths
  (the last hidden state within 1e-4, every layer's attention within 1e-5, its relative-position
  bias, positions from padding_idx + 1, no token types), every layer exposes its queries, keys and
  values, and `hf.save` writes what transformers loads as `MPNetModel`, read back bit for bit."""
  path = _random_mpnet(tmp_path)
  model, params = _load(path)
  assert model.config.model_type == "mpnet" and model.config.position_offset == 2
  assert "token_type_embeddings" not in params["embeddings"] and params["relative_attention_bias"]
  for length, lengths in ((11, [11, 7, 4]), (200, [200, 150, 3])):  # beyond 128 apart: the far buckets
    rng = np.random.default_rng(length)
    ids = rng.integers(3, 120, size=(3, length))
    mask = np.zeros_like(ids)
    for j, n in enumerate(lengths):
      mask[j, :n], ids[j, n:] = 1, 1
    batch = {"input_ids": ids, "attention_mask": mask}
    ours = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), return_attention=True)
    _assert_parity(ours, _theirs(path, batch), mask)
    assert ours.layers[0].q.shape == ours.layers[-1].v.shape == (3, 4, length, 12)
  out = str(tmp_path / "exported")
  hf.save(out, model.config, params)
  exported = transformers.AutoModel.from_pretrained(out)
  assert type(exported).__name__ == "MPNetModel"
  batch = {"input_ids": ids, "attention_mask": mask}
  np.testing.assert_allclose(
    _theirs(out, batch).last_hidden_state.numpy(), _theirs(path, batch).last_hidden_state.numpy(), atol=1e-6
  )
  jax.tree.map(np.testing.assert_array_equal, params, hf.load(out).params)


def test_an_mpnet_config_the_encoder_cannot_honour_is_one_line(tmp_path):
  with pytest.raises(UserError, match="relative_attention_num_buckets=16: transformers buckets relative positions"):
    hf.load(_random_mpnet(tmp_path, relative_attention_num_buckets=16))


# DeBERTa-v3-base's attention (its config.json), and the variants transformers also implements.
DEBERTA_V3 = dict(
  relative_attention=True,
  position_buckets=8,
  max_relative_positions=-1,
  pos_att_type=["p2c", "c2p"],
  share_att_key=True,
  norm_rel_ebd="layer_norm",
  position_biased_input=False,
  type_vocab_size=0,
)
DEBERTA_VARIANTS = {
  "v3": DEBERTA_V3,
  "separate_position_keys_and_absolute_positions": {
    **DEBERTA_V3,
    "share_att_key": False,
    "position_biased_input": True,
    "type_vocab_size": 2,
    "norm_rel_ebd": "none",
  },
  "no_buckets_c2p_only": {**DEBERTA_V3, "position_buckets": -1, "max_relative_positions": 24, "pos_att_type": ["c2p"]},
}


def _random_deberta(tmp_path, **overrides):
  return _random_model(
    tmp_path, "DebertaV2", max_position_embeddings=256, pad_token_id=0, hidden_act="gelu", **overrides
  )


def test_deberta_relative_positions_are_transformers():
  from minilm_jax.models.deberta import relative_positions

  layer = torch.zeros(1, 300, 4)
  theirs = transformers.models.deberta_v2.modeling_deberta_v2.build_relative_position(layer, layer, 256, 512)
  np.testing.assert_array_equal(relative_positions(300, 256, 512), theirs[0].numpy())
  theirs = transformers.models.deberta_v2.modeling_deberta_v2.build_relative_position(layer, layer, 8, 256)
  np.testing.assert_array_equal(relative_positions(300, 8, 256), theirs[0].numpy())


@pytest.mark.parametrize("variant", DEBERTA_VARIANTS)
def test_random_deberta_matches_transformers_and_exports_as_deberta(tmp_path, variant):
  """A DeBERTa-v2/v3 checkpoint transformers wrote loads with parity on padded batches of several
  lengths (c2p and p2c terms, log-bucketed relative positions, shared or separate position keys,
  the relative embeddings' norm, absolute positions where asked), every layer exposing its content
  queries, keys and values; `hf.save` writes what transformers loads as `DebertaV2Model`."""
  path = _random_deberta(tmp_path, **DEBERTA_VARIANTS[variant])
  model, params = _load(path)
  assert model.config.model_type == "deberta-v2"
  for length, lengths in ((11, [11, 7, 4]), (40, [40, 30, 3])):  # beyond 4 apart: the log buckets
    rng = np.random.default_rng(length)
    ids = rng.integers(3, 120, size=(3, length))
    mask = np.zeros_like(ids)
    for j, n in enumerate(lengths):
      mask[j, :n], ids[j, n:] = 1, 0
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    ours = _ours(model, params, batch)
    _assert_parity(ours, _theirs(path, batch), mask)
    assert ours.layers[0].q.shape == ours.layers[-1].v.shape == (3, 4, length, 12)
  out = str(tmp_path / "exported")
  hf.save(out, model.config, params)
  assert type(transformers.AutoModel.from_pretrained(out)).__name__ == "DebertaV2Model"
  np.testing.assert_allclose(
    _theirs(out, batch).last_hidden_state.numpy(), _theirs(path, batch).last_hidden_state.numpy(), atol=1e-6
  )
  again = hf.load(out).params
  for key in ("embeddings", "layer_0", "layer_1"):
    jax.tree.map(np.testing.assert_array_equal, params[key], again[key])


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"pos_att_type": ["p2p"]}, "deberta-v2 pos_att_type \\['p2p'\\]: transformers computes c2p, p2c alone"),
    ({"conv_kernel_size": 3}, "conv_kernel_size > 0"),
  ],
)
def test_a_deberta_config_the_encoder_cannot_honour_is_one_line(tmp_path, overrides, message):
  path = tmp_path / "deberta"
  path.mkdir()
  config = transformers.DebertaV2Config(hidden_size=48, num_attention_heads=4, **{**DEBERTA_V3, **overrides})
  (path / "config.json").write_text(config.to_json_string())
  with pytest.raises(UserError, match=message):
    hf.load(str(path))


def _random_modernbert(tmp_path, **overrides):
  """4 layers: 0 and 3 global, 1 and 2 within a 16-token window."""
  ids = {"pad_token_id": 0, "bos_token_id": 1, "cls_token_id": 1, "eos_token_id": 2, "sep_token_id": 2}
  fields = {"num_hidden_layers": 4, "max_position_embeddings": 512, "local_attention": 16, **ids, **overrides}
  return _random_model(tmp_path, "ModernBert", **fields)


@pytest.mark.slow
def test_random_modernbert_matches_transformers_and_exports_as_modernbert(tmp_path):
  """A ModernBERT checkpoint transformers wrote loads with parity on padded batches of several
  lengths, longer than the sliding window (pre-norm layers, GeGLU, no biases, RoPE with the global
  and the local base, the window on the sliding layers, the final norm), every layer exposing its
  queries, keys and values; `hf.save` writes what transformers loads as `ModernBertModel`, the
  fused maps split and stacked back bit for bit."""
  path = _random_modernbert(tmp_path)
  model, params = _load(path)
  c = model.config
  assert (c.model_type, c.sliding_layers, c.local_window, c.rope_theta, c.local_rope_theta) == (
    "modernbert",
    (1, 2),
    16,
    160_000.0,
    10_000.0,
  )
  assert "attention" in params["layer_1"] and "LayerNorm" not in params["layer_0"]["attention"]
  for length, lengths in ((11, [11, 7, 4]), (40, [40, 30, 3])):  # 40 tokens: 20 beyond the window
    rng = np.random.default_rng(length)
    ids = rng.integers(3, 120, size=(3, length))
    mask = np.zeros_like(ids)
    for j, n in enumerate(lengths):
      mask[j, :n], ids[j, n:] = 1, 0
    batch = {"input_ids": ids, "attention_mask": mask}
    ours = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), return_attention=True)
    _assert_parity(ours, _theirs(path, batch), mask)
    assert ours.layers[0].q.shape == ours.layers[-1].v.shape == (3, 4, length, 12)
    fused = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))  # the window in XLA's kernel
    rows = mask.astype(bool)
    np.testing.assert_allclose(fused.last_hidden_state[rows], ours.last_hidden_state[rows], atol=1e-5)
  far = np.asarray(ours.layers[1].attention)[0, :, 0, 20:]  # a sliding layer: nothing beyond 8 apart
  assert far.max() == 0.0 and np.asarray(ours.layers[3].attention)[0, :, 0, 20:].min() > 0.0
  out = str(tmp_path / "exported")
  hf.save(out, c, params)
  assert type(transformers.AutoModel.from_pretrained(out)).__name__ == "ModernBertModel"
  np.testing.assert_array_equal(
    _theirs(out, batch).last_hidden_state.numpy(), _theirs(path, batch).last_hidden_state.numpy()
  )
  again = hf.load(out)
  assert again.config == c
  for key in ("embeddings", "layer_0", "layer_3", "final_norm"):
    jax.tree.map(np.testing.assert_array_equal, params[key], again.params[key])


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"local_attention": 15}, "local_attention=15: the sliding window .* must be even; use 16"),
    ({"attention_bias": True}, "modernbert with attention_bias=True: not implemented"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "modernbert layer_types"),
  ],
)
def test_a_modernbert_config_the_encoder_cannot_honour_is_one_line(tmp_path, overrides, message):
  path = tmp_path / "modernbert"
  path.mkdir()
  config = {"model_type": "modernbert", "vocab_size": 120, "hidden_size": 48, "num_hidden_layers": 2}
  (path / "config.json").write_text(json.dumps({**config, "num_attention_heads": 4, **overrides}))
  with pytest.raises(UserError, match=message):
    hf.load(str(path))
