"""A Transformer encoder whose layers hand back Q, K, V: the BERT family (BERT, RoBERTa, XLM-R),
MPNet, DeBERTa v2/v3 and ModernBERT, the architectures `models.config.MODEL_TYPES` names.

Post-layer-norm, exact (erf) GELU, absolute learned positions, as Hugging Face's BertModel and
RobertaModel; MPNet adds to every layer's attention scores a bias by bucketed relative position
(`mpnet.RelativePositionBias`), one table shared by the layers, and has no token types; DeBERTa
adds its disentangled c2p and p2c terms from relative embeddings shared by the layers
(`deberta.disentangled_bias`), and has absolute positions only where its config asks; ModernBERT
(`models.modernbert`) norms before each block rather than after, rotates its queries and keys by
position, lets some layers attend within a sliding window, gates its feed-forward block and has no
biases. Parameters are
float32; `EncoderConfig.dtype` sets the compute dtype. Softmax and layer-norm statistics always run
in float32 (flax's LayerNorm promotes its statistics itself).

Module names follow the Hugging Face layout so that the name mapping in `minilm_jax.models.hf` is one
short table.
"""

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from minilm_jax.kernels import attention as attention_kernel
from minilm_jax.kernels import dropout as dropout_bits
from minilm_jax.kernels.platform import compute_platform, kernel_platform, on_accelerator
from minilm_jax.models import deberta, layout, modernbert, mpnet
from minilm_jax.models.attention import (
  Attending,
  ScopeRng,
  ScoreTerms,
  attention_with_dropout,
  dropped_out,
  fused_attention,
  scores,
)
from minilm_jax.models.config import ACTIVATIONS, DTYPES, EncoderConfig


@flax.struct.dataclass
class LayerOutput:
  """What one Transformer layer exposes. q/k/v: [batch, heads, length, head_dim];
  attention: [batch, heads, length, length] (float32), or None unless the encoder was called with
  `return_attention=True`; hidden: the layer's output [batch, length, hidden]."""

  q: jax.Array
  k: jax.Array
  v: jax.Array
  attention: jax.Array | None
  hidden: jax.Array


@flax.struct.dataclass
class EncoderOutput:
  last_hidden_state: jax.Array
  pooler_output: jax.Array
  embeddings: jax.Array
  layers: tuple  # of LayerOutput, one per Transformer layer


def _dense(features, config, name):
  return nn.Dense(
    features,
    use_bias=config.architecture.biases,
    dtype=DTYPES[config.dtype],
    param_dtype=jnp.float32,
    kernel_init=nn.initializers.normal(config.initializer_range),
    name=name,
  )


class _DenseParams(nn.Module):
  """An `nn.Dense`'s parameters (its names, shapes, dtype and initialisers, so the same checkpoints
  and conversions), returned for a product the caller writes itself: (kernel, bias or None)."""

  features: int
  config: EncoderConfig

  @nn.compact
  def __call__(self, in_features: int):
    kernel = self.param(
      "kernel", nn.initializers.normal(self.config.initializer_range), (in_features, self.features), jnp.float32
    )
    if not self.config.architecture.biases:
      return kernel, None
    return kernel, self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)


class LayerNorm(nn.Module):
  """`nn.LayerNorm`'s parameters ("scale", and "bias" where the architecture has biases) and its
  two-pass statistics (the variance of the centred input: E[x^2] - E[x]^2 loses float32 precision
  when the mean is large, 1e-4 off transformers), in float32, written out: on a CPU flax's own
  two-pass form took a pre-norm 6x384 student's step from 0.59 to 0.74 s (its input also feeds
  the residual sum)."""

  epsilon: float
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    features = x.shape[-1]
    x = x.astype(jnp.float32)
    centred = x - jnp.mean(x, axis=-1, keepdims=True)
    variance = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * (jax.lax.rsqrt(variance + self.epsilon) * self.param("scale", nn.initializers.ones, (features,)))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (features,))
    return y.astype(self.dtype)


def _layer_norm(config, name):
  return LayerNorm(config.layer_norm_eps, config.architecture.biases, DTYPES[config.dtype], name=name)


def _embed(num, config, name):
  return nn.Embed(
    num,
    config.embedding_size or config.hidden_size,
    param_dtype=jnp.float32,
    embedding_init=nn.initializers.normal(config.initializer_range),
    name=name,
  )


def position_ids(input_ids_BxL, config: EncoderConfig):
  if not config.architecture.positions_after_padding:
    return jnp.broadcast_to(jnp.arange(input_ids_BxL.shape[1]), input_ids_BxL.shape)
  # RoBERTa: padding tokens sit at padding_idx, real tokens count up from padding_idx + 1.
  real = (input_ids_BxL != config.pad_token_id).astype(jnp.int32)
  return jnp.cumsum(real, axis=1) * real + config.pad_token_id


class Embeddings(nn.Module):
  config: EncoderConfig

  @nn.compact
  def __call__(self, input_ids_BxL, token_type_ids_BxL, deterministic, position_ids_BxL=None, mask_BxL=None):
    c = self.config
    if position_ids_BxL is None:
      position_ids_BxL = position_ids(input_ids_BxL, c)
    x = _embed(c.vocab_size, c, "word_embeddings")(input_ids_BxL)
    if c.absolute_positions:  # DeBERTa-v3 has none
      x += _embed(c.max_position_embeddings, c, "position_embeddings")(position_ids_BxL)
    if c.type_vocab_size:  # MPNet and DeBERTa-v3 have no token types
      x += _embed(c.type_vocab_size, c, "token_type_embeddings")(token_type_ids_BxL)
    if c.embedding_size:  # DeBERTa's narrower word embeddings, projected to the hidden width
      x = nn.Dense(c.hidden_size, use_bias=False, param_dtype=jnp.float32, name="embed_proj")(x)
    x = _layer_norm(c, "LayerNorm")(x.astype(DTYPES[c.dtype]))
    if c.architecture.masks_embeddings and mask_BxL is not None:
      x = x * mask_BxL[..., None].astype(x.dtype)
    return Dropout(c.hidden_dropout)(x, deterministic=deterministic)


class Dropout(nn.Module):
  """`nn.Dropout` (the same names, so the same "dropout" rng of each scope) whose keep mask is the
  flash kernel's counter-based hash (`kernels.dropout.keep_like`) of each entry's index and a seed
  from that rng, not threefry's bits: on a CPU threefry costs 8 ms for a [16, 128, 384]
  activation, the hash under 1 ms (the 3x384 student's step drops out 7 of them)."""

  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    if self.rate == 1.0:
      return jnp.zeros_like(x)
    keep = dropout_bits.keep_like(dropout_bits.seed_from_key(self.make_rng("dropout")), x.shape, self.rate)
    return jax.lax.select(keep, x * jnp.asarray(dropout_bits.scale(self.rate), x.dtype), jnp.zeros_like(x))


def _probe(module, name, x):
  """Marks a neuron activation for importance scores (ETD-Impt): `sow`s it to "intermediates" and adds a
  zero "perturbations" variable whose gradient is dL/dx. Both are no-ops unless those collections are
  passed to `apply`, so ordinary calls pay nothing."""
  module.sow("intermediates", name, x)
  return module.perturb(name, x)


# What a rematerialised layer's backward pass keeps (`_RematerialisedLayer`).
_KEPT = "kept_for_backward"


def _kept(x):
  return checkpoint_name(x, _KEPT)


@flax.struct.dataclass
class KVCache:
  """Keys and values of every layer for incremental decoding: `keys[i]`, `values[i]` are
  [batch, heads, max_length, head_dim]; the new tokens are written from position `index` on."""

  keys: tuple
  values: tuple
  index: jax.Array


def _projections(x_BxLxD, kernels, biases, c: EncoderConfig):
  """Queries, keys and values [B, L, H, K] (the layout the fused kernels take). One product for the
  three projections (their parameters kept apart, as `nn.Dense`'s): x is read once rather than
  three times, forward and backward. The three results side by side, [B, L, 3, D], except on TPUs,
  which tile an array's last two dimensions in blocks of (8, 128) and would pad the 3 to 8: there
  [3, B, L, D] (at the paper's 6x384 step, 1.78e11 bytes on an H100 against 1.84e11 the other way;
  2.28e11 on a v5e-8 against 2.55e11)."""
  b, l, _ = x_BxLxD.shape
  dtype, on_tpu = DTYPES[c.dtype], compute_platform() == "tpu"
  qkv = jnp.einsum(
    "bld,tdf->tblf" if on_tpu else "bld,tdf->bltf", x_BxLxD.astype(dtype), jnp.stack(kernels).astype(dtype)
  )
  if c.architecture.biases:
    bias_3xD = jnp.stack(biases).astype(dtype)
    qkv = qkv + (bias_3xD[:, None, None] if on_tpu else bias_3xD)
  parts = [qkv[i] if on_tpu else qkv[:, :, i] for i in range(3)]
  return tuple(part.reshape(b, l, c.num_heads, c.head_dim) for part in parts)


class SelfAttention(nn.Module):
  """Multi-head self-attention. The attention probabilities are materialised only when asked for
  (`return_attention`), when attention dropout must be applied to them, or when decoding from a
  cache; otherwise the fused `jax.nn.dot_product_attention` computes the context without keeping
  [B, H, L, L] tensors. `cache` ([B, H, max_length, K] keys and values, and where the new tokens
  go) makes the new tokens attend over the cached ones as well; the returned k, v are then the
  updated caches. `attending`'s relative positions bias the scores: the fused kernels that take no
  bias give way to XLA's. A pre-norm layer (ModernBERT's) norms its input first, but for the
  encoder's `first` layer, and adds its output to its input without a norm after. A `sliding`
  layer's queries see the keys within its window alone (`EncoderConfig.local_window`)."""

  config: EncoderConfig
  first: bool = False
  sliding: bool = False

  @nn.compact
  def __call__(self, x_BxLxD, attending: Attending, deterministic, return_attention=False, cache=None):
    c = self.config
    residual = x_BxLxD
    if c.architecture.pre_norm and not self.first:
      x_BxLxD = _layer_norm(c, "LayerNorm")(x_BxLxD)
    x_BxLxD = _probe(self, "input", x_BxLxD)
    b, l, _ = x_BxLxD.shape
    kernels, biases = zip(
      *(_DenseParams(c.hidden_size, c, name=n)(x_BxLxD.shape[-1]) for n in ("query", "key", "value"))
    )
    q, k, v = _projections(x_BxLxD, kernels, biases, c)
    if attending.rotation is not None:  # the layers expose the rotated queries and keys (docs/fidelity.md)
      q, k = modernbert.rotate(q, attending.rotation), modernbert.rotate(k, attending.rotation)
    q, k, v = _kept(q), _kept(k), _kept(v)
    mask, terms = attending.mask, ScoreTerms(attending.positions, window=c.local_window if self.sliding else 0)
    if c.architecture.disentangled_attention:  # its terms count in the divisor, relative or not
      bias = None
      if attending.positions is not None:
        maps = self._position_maps(kernels, biases)
        bias = deberta.disentangled_bias(q, k, attending.positions, maps, c.score_scale)
      terms = ScoreTerms(bias, c.score_scale)
    swap = lambda t: t.transpose(0, 2, 1, 3)  # [B, L, H, K] <-> [B, H, L, K]
    if cache is not None:
      cached_k, cached_v, index = cache
      k = swap(jax.lax.dynamic_update_slice_in_dim(cached_k, swap(k).astype(cached_k.dtype), index, 2))
      v = swap(jax.lax.dynamic_update_slice_in_dim(cached_v, swap(v).astype(cached_v.dtype), index, 2))
    dropout_on_probs = not deterministic and c.attention_dropout > 0
    attention = None
    hidden_dropout_name = None  # flax's own name ("Dropout_<n>"), unless set below
    if return_attention or cache is not None:
      attention = _kept(jax.nn.softmax(scores(q, k, mask, terms), axis=-1))
      probs = attention
      if dropout_on_probs:  # the rng the branch below draws: the same entries dropped
        probs = dropped_out(attention, ScopeRng(name="Dropout_0")(), c.attention_dropout)
        hidden_dropout_name = "Dropout_1"
      context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    elif dropout_on_probs:
      # The rng of the scope an nn.Dropout here would have ("Dropout_0"); the hidden dropout after
      # it keeps its name "Dropout_1". On accelerators (and in the kernel tests) the flash kernel
      # makes the dropout mask inside from a seed drawn from that rng, so no [B, H, L, L] tensor
      # reaches HBM; elsewhere the explicit path makes the same mask from the same seed.
      rng = ScopeRng(name="Dropout_0")()
      platform = kernel_platform() if terms.bias is None and not terms.window else None  # ours: no bias, no window
      if platform and mask.ndim == 2 and attention_kernel.supported(l, c.head_dim, platform):
        context = attention_kernel.flash_attention(
          q, k, v, mask, dropout_bits.seed_from_key(rng), c.attention_dropout, platform
        )
      else:
        context = attention_with_dropout(q, k, v, mask, rng, c.attention_dropout, terms)
      hidden_dropout_name = "Dropout_1"
    else:
      context = fused_attention(q, k, v, mask, terms)
    context = _kept(context)
    out = _dense(c.hidden_size, c, "output")(_probe(self, "heads", context.reshape(b, l, c.hidden_size)))
    out = Dropout(c.hidden_dropout, name=hidden_dropout_name)(out, deterministic=deterministic)
    out = _kept(out + residual)
    if not c.architecture.pre_norm:
      out = _layer_norm(c, "LayerNorm")(out)
    return out, (swap(q), swap(k), swap(v), attention)

  def _position_maps(self, kernels, biases) -> dict:
    """DeBERTa's maps of the relative embeddings by term: the layer's own key (c2p) and query (p2c)
    maps (`share_att_key`), or position maps of their own."""
    c, maps = self.config, {}
    for term, shared, name in (("c2p", 1, "pos_key"), ("p2c", 0, "pos_query")):
      if term in c.relative_terms.split(","):
        own = None if c.share_position_keys else _DenseParams(c.hidden_size, c, name=name)(c.hidden_size)
        maps[term] = (kernels[shared], biases[shared]) if own is None else own
    return maps


class TransformerLayer(nn.Module):
  """Self-attention, then the feed-forward block, each added to its input and normed after (BERT's
  post-norm) or normed before (a pre-norm architecture's: "output_LayerNorm" is then the norm
  before the feed-forward block). A gated block multiplies the activation by a second map ("gate")."""

  config: EncoderConfig
  first: bool = False  # the encoder's first layer: a pre-norm one has no norm before its attention
  sliding: bool = False  # its attention within a sliding window (ModernBERT's `sliding_layers`)

  @nn.compact
  def __call__(self, x_BxLxD, attending: Attending, deterministic, return_attention=False, cache=None):
    c = self.config
    h, (q, k, v, attention) = SelfAttention(c, self.first, self.sliding, name="attention")(
      x_BxLxD, attending, deterministic, return_attention, cache
    )
    ffn_input = _layer_norm(c, "output_LayerNorm")(h) if c.architecture.pre_norm else h
    if c.architecture.gated_mlp:
      # One product for the two maps (their parameters kept apart): on a CPU, two bias-free products
      # of one input under the gate took a ModernBERT 6x384 student's step from 0.67 to 0.95 s.
      maps = [_DenseParams(c.intermediate_size, c, name=n)(ffn_input.shape[-1])[0] for n in ("intermediate", "gate")]
      both = ffn_input @ jnp.concatenate(maps, axis=1).astype(ffn_input.dtype)
      pre_activation, gate = _kept(both[..., : c.intermediate_size]), both[..., c.intermediate_size :]
      activation = ACTIVATIONS[c.hidden_act](pre_activation) * gate
    else:
      pre_activation = _kept(_dense(c.intermediate_size, c, "intermediate")(ffn_input))
      activation = ACTIVATIONS[c.hidden_act](pre_activation)
    y = _dense(c.hidden_size, c, "output")(_probe(self, "ffn", activation))
    y = Dropout(c.hidden_dropout)(y, deterministic=deterministic)
    out = _kept(y + h)
    if not c.architecture.pre_norm:
      out = _layer_norm(c, "output_LayerNorm")(out)
    return LayerOutput(q=q, k=k, v=v, attention=attention, hidden=out)


# Training on an accelerator, each layer runs rematerialised and its backward pass keeps only what
# `_kept` marks (Q, K, V, the attention's context and its kernel's log-sum-exp, the inputs of both
# layer norms, the feed-forward block's pre-activation; the probabilities where they are returned),
# recomputing the rest from them, all elementwise: the layer norms' outputs (the next products'
# inputs: each layer norm otherwise keeps its input for its own gradient and its output for the
# next product's, the same [B, L, D] twice), the activation (exact GELU's erf products, three
# [B, L, intermediate] tensors) and the dropout masks (from their rng). XLA drops the recomputed
# products that no gradient reads. At MiniLM's 256 x 512 on one H100 the activation's remat took
# the step's peak from 17.0 to 13.9 GiB, the attention kernels to 8.3, keeping the layer norms'
# inputs only to 7.5 (`python -m minilm_jax.aot --config configs/minilm_6x384.py --target h100x1`),
# with no more products. CPUs, whose memory is not the limit, keep everything: a recomputation is
# only cost there. Where our attention kernel does not take a shape, the [B, H, L, L] scores,
# probabilities and mask are recomputed too (3 GiB a layer at batch 256 x 512; one more [L, L]
# product a layer in the backward pass).
_RematerialisedLayer = nn.remat(
  TransformerLayer,
  policy=jax.checkpoint_policies.save_only_these_names(_KEPT, attention_kernel.RESIDUALS),
  static_argnums=(3, 4, 5),  # deterministic, return_attention, cache (self is 0)
)


class Encoder(nn.Module):
  """`apply({"params": p}, input_ids, attention_mask, token_type_ids) -> EncoderOutput`.

  `deterministic=False` turns dropout on (needs a "dropout" rng). Every layer's Q/K/V is returned
  (under `jit`, whatever the caller does not use is pruned); its attention probabilities only with
  `return_attention=True` (otherwise `None`: the layers run fused attention).

  `attention_mask` is [B, L] (padding: every token sees the real tokens) or [B, L, L] (which key
  each query sees: the sequence-to-sequence mask). `position_ids` default to the model type's
  numbering of the real tokens. `cache` (a `KVCache`) decodes incrementally: the L new tokens are
  written into every layer's cache at `cache.index`, the mask is then [B, L, max_length], and the
  layers' k, v are the updated caches.
  """

  config: EncoderConfig

  @nn.compact
  def __call__(
    self,
    input_ids_BxL,
    attention_mask=None,
    token_type_ids_BxL=None,
    deterministic: bool = True,
    num_layers: int | None = None,
    return_attention: bool = False,
    position_ids_BxL=None,
    cache: KVCache | None = None,
  ):
    c = self.config
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids_BxL)
    if token_type_ids_BxL is None:
      token_type_ids_BxL = jnp.zeros_like(input_ids_BxL)
    mask = attention_mask.astype(bool)
    x = Embeddings(c, name="embeddings")(input_ids_BxL, token_type_ids_BxL, deterministic, position_ids_BxL, mask)
    embeddings = x
    attending = Attending(mask, self._relative_positions(input_ids_BxL.shape[1], cache))
    by_kind = {False: attending}  # a layer's Attending by whether it attends within a sliding window
    if c.architecture.rotary:
      assert cache is None, "incremental decoding is the BERT family's (UniLM's sequence-to-sequence model)"
      positions_BxL = position_ids(input_ids_BxL, c) if position_ids_BxL is None else position_ids_BxL
      by_kind = modernbert.layer_attending(c, mask, positions_BxL)
    layers = []
    layer = _RematerialisedLayer if not deterministic and on_accelerator() else TransformerLayer
    for i in range(c.num_layers if num_layers is None else num_layers):
      layer_cache = None if cache is None else (cache.keys[i], cache.values[i], cache.index)
      sliding = i in c.sliding_layers
      out = layer(c, i == 0, sliding, name=layout.layer_name(i))(
        x, by_kind[sliding], deterministic, return_attention, layer_cache
      )
      layers.append(out)
      x = out.hidden
    if c.architecture.pre_norm:  # the residual stream normed once at the end
      x = _layer_norm(c, "final_norm")(x)
    pooled = jnp.tanh(_dense(c.hidden_size, c, "pooler")(x[:, 0]))
    return EncoderOutput(last_hidden_state=x, pooler_output=pooled, embeddings=embeddings, layers=tuple(layers))

  def _relative_positions(self, length: int, cache):
    """What every layer's attention reads of the relative positions, computed once (one table for
    every layer, as transformers shares it): MPNet's bias, DeBERTa's relative embeddings and index."""
    c = self.config
    if c.architecture.position_bias or c.architecture.disentangled_attention:
      assert cache is None, "incremental decoding is the BERT family's (UniLM's sequence-to-sequence model)"
    if c.architecture.position_bias:
      return mpnet.RelativePositionBias(c, name="relative_attention_bias")(length)
    if c.architecture.disentangled_attention and c.max_relative_positions:
      return deberta.RelativeEmbeddings(c, name="relative_embeddings")(length)
    return None


def dummy_ids(length: int = 8):
  """The inputs `init` traces a model with: one sequence of `length` tokens (parameter shapes do
  not depend on it)."""
  return jnp.zeros((1, length), jnp.int32)


def init_params(config: EncoderConfig, rng: jax.Array):
  """Random (BERT-style normal(0.02)) parameters for `config`."""
  return Encoder(config).init(rng, dummy_ids())["params"]


def abstract_params(config: EncoderConfig):
  """Parameter shapes and dtypes, without allocating them: a fresh tree of `jax.ShapeDtypeStruct`s
  for each caller, from one trace of the model's init per config in a process."""
  return jax.tree.map(lambda leaf: leaf, _traced_params(config))


# A run asks for the same shapes while it loads a checkpoint (twice), validates, builds its step,
# restores and exports: each ask traced the whole model's init (0.1-0.5 s of Python per model).
@functools.lru_cache(maxsize=32)
def _traced_params(config: EncoderConfig):
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def extend_positions(params, length: int):
  """Encoder params whose position table covers `length` positions, the pre-trained table repeated
  (as UniLM fine-tunes CNN/DailyMail at 768 tokens on 512-position models)."""
  table = params["embeddings"]["position_embeddings"]["embedding"]
  repeats = -(-length // table.shape[0])
  extended = jnp.tile(table, (repeats, 1))[:length]
  embeddings = {**params["embeddings"], "position_embeddings": {"embedding": extended}}
  return {**params, "embeddings": embeddings}
