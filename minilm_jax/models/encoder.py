"""A post-layer-norm Transformer encoder whose layers hand back Q, K, V: the BERT family (BERT,
RoBERTa, XLM-R), MPNet and DeBERTa v2/v3, the architectures `models.config.MODEL_TYPES` names.

Post-layer-norm, exact (erf) GELU, absolute learned positions, as Hugging Face's BertModel and
RobertaModel; MPNet adds to every layer's attention scores a bias by bucketed relative position
(`mpnet.RelativePositionBias`), one table shared by the layers, and has no token types; DeBERTa
adds its disentangled c2p and p2c terms from relative embeddings shared by the layers
(`deberta.disentangled_bias`), and has absolute positions only where its config asks. Parameters are
float32; `EncoderConfig.dtype` sets the compute dtype. Softmax and layer-norm statistics always run
in float32 (flax's LayerNorm promotes its statistics itself).

Module names follow the Hugging Face layout so that the name mapping in `minilm_jax.models.hf` is one
short table.
"""

from typing import Any, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from minilm_jax.kernels import attention as attention_kernel
from minilm_jax.kernels import dropout as dropout_bits
from minilm_jax.kernels.attention import MASK_VALUE
from minilm_jax.kernels.platform import compute_platform, kernel_platform, on_accelerator
from minilm_jax.models import deberta, layout, mpnet
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
    dtype=DTYPES[config.dtype],
    param_dtype=jnp.float32,
    kernel_init=nn.initializers.normal(config.initializer_range),
    name=name,
  )


class _DenseParams(nn.Module):
  """An `nn.Dense`'s parameters (its names, shapes, dtype and initialisers, so the same checkpoints
  and conversions), returned for a product the caller writes itself."""

  features: int
  config: EncoderConfig

  @nn.compact
  def __call__(self, in_features: int):
    kernel = self.param(
      "kernel", nn.initializers.normal(self.config.initializer_range), (in_features, self.features), jnp.float32
    )
    return kernel, self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)


def _layer_norm(config, name):
  # use_fast_variance=False: E[x^2]-E[x]^2 loses float32 precision when the mean is large (off by 1e-4 from HF).
  return nn.LayerNorm(
    epsilon=config.layer_norm_eps,
    dtype=DTYPES[config.dtype],
    param_dtype=jnp.float32,
    use_fast_variance=False,
    name=name,
  )


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


def split_heads(x_BxLxD, num_heads):
  b, l, d = x_BxLxD.shape
  return x_BxLxD.reshape(b, l, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def merge_heads(x_BxHxLxK):
  b, h, l, k = x_BxHxLxK.shape
  return x_BxHxLxK.transpose(0, 2, 1, 3).reshape(b, l, h * k)


def _key_mask(mask):
  """[B, Lk] padding mask (every query sees the same keys) or [B, Lq, Lk] per-query mask ->
  [B, 1, Lq or 1, Lk], broadcastable over heads."""
  return mask[:, None, None, :] if mask.ndim == 2 else mask[:, None, :, :]


def fused_attention_implementation(dtype, head_dim: int, platform: str | None = None) -> str:
  """Which kernel `jax.nn.dot_product_attention` runs: cuDNN's flash attention on GPUs for the
  half-precision dtypes and head sizes it supports, XLA's (the same einsum-softmax-einsum as the
  explicit path, without returning the probabilities) everywhere else."""
  on_gpu = (platform or compute_platform()) in ("gpu", "cuda")
  if on_gpu and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and head_dim % 8 == 0 and head_dim <= 128:
    return "cudnn"
  return "xla"


class ScoreTerms(NamedTuple):
  """What attention scores add to the content product (a [1 or B, H, L, L] bias by relative position:
  MPNet's, DeBERTa's c2p and p2c; None: BERT's) and what divides them (None: sqrt(head_dim))."""

  bias: jax.Array | None = None
  scale: float | None = None


class Attending(NamedTuple):
  """What a layer's attention reads besides its input: the keys each query sees ([B, L] or [B, L, L])
  and what the encoder computed once of relative positions (`Encoder._relative_positions`)."""

  mask: jax.Array
  positions: Any = None


def fused_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, terms: ScoreTerms = ScoreTerms()):
  """Context [B, L, H, K] of fused attention under a [B, Lk] padding mask or a [B, Lq, Lk] mask,
  the scores biased by `terms` (relative positions: XLA's kernel, which takes a bias where cuDNN's
  and ours do not).
  cuDNN's kernel takes padding as per-row lengths, not as a mask (in bfloat16 it rejects a mask
  broadcast over queries: "Bias must have same seq length as QKV"); our padding is on the right
  (packed blocks, tokenizers' right padding), so a row's length is its count of real tokens. On
  TPUs our flash kernel (`kernels.attention`, without dropout) keeps the [B, H, L, L] scores out
  of HBM, where XLA's attention writes them. A per-query mask (sequence-to-sequence) stays with
  XLA's kernel."""
  head_dim = q_BxLxHxK.shape[-1]
  if terms.bias is not None:
    return jax.nn.dot_product_attention(
      q_BxLxHxK,
      k_BxLxHxK,
      v_BxLxHxK,
      bias=terms.bias.astype(q_BxLxHxK.dtype),
      mask=_key_mask(mask),
      scale=None if terms.scale is None else 1.0 / terms.scale,
      implementation="xla",
    )
  implementation = fused_attention_implementation(q_BxLxHxK.dtype, head_dim)
  if implementation == "cudnn" and mask.ndim == 2:
    lengths_B = jnp.sum(mask, axis=-1, dtype=jnp.int32)
    return jax.nn.dot_product_attention(
      q_BxLxHxK,
      k_BxLxHxK,
      v_BxLxHxK,
      query_seq_lengths=lengths_B,
      key_value_seq_lengths=lengths_B,
      implementation="cudnn",
    )
  if mask.ndim == 2 and kernel_platform() == "tpu" and attention_kernel.supported(mask.shape[1], head_dim, "tpu"):
    return attention_kernel.flash_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, 0, 0.0, "tpu")
  return jax.nn.dot_product_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask=_key_mask(mask), implementation="xla")


class _ScopeRng(nn.Module):
  """The "dropout" rng of this module's scope: what an `nn.Dropout` of the same name would draw."""

  @nn.compact
  def __call__(self):
    return self.make_rng("dropout")


def _dropped_out(attention_BxHxQxK, rng, rate: float):
  """Attention probabilities dropped out, each entry kept or dropped as the flash kernel keeps or
  drops it (`kernels.dropout.keep_mask` of a seed from `rng`), so a run drops the same entries on
  every platform and path. On a CPU this hash costs a twentieth of `jax.random.bernoulli`'s
  threefry bits (1.4 ms against 32 ms for [16, 12, 128, 128]), 9 % of the 3x384 student's step."""
  batch, heads, queries, keys = attention_BxHxQxK.shape
  keep = dropout_bits.keep_mask(dropout_bits.seed_from_key(rng), batch, heads, queries, rate, keys)
  scaled = attention_BxHxQxK * jnp.asarray(dropout_bits.scale(rate), attention_BxHxQxK.dtype)
  return jax.lax.select(keep, scaled, jnp.zeros_like(attention_BxHxQxK))


def _scores(q_BxLxHxK, k_BxLxHxK, mask, terms: ScoreTerms):
  """[B, H, Lq, Lk] float32 attention scores over their divisor, biased and masked (`terms`)."""
  scale = jnp.sqrt(q_BxLxHxK.shape[-1]).astype(jnp.float32) if terms.scale is None else jnp.float32(terms.scale)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q_BxLxHxK, k_BxLxHxK).astype(jnp.float32) / scale
  if terms.bias is not None:
    scores = scores + terms.bias
  return jnp.where(_key_mask(mask), scores, MASK_VALUE)


def _attention_with_dropout(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask, rng, rate: float, terms: ScoreTerms):
  """Context [B, L, H, K] of attention whose probabilities are dropped out (`_dropped_out`). On
  accelerators, where a shape does not suit our kernel (`kernels.attention.supported`), its
  layer's backward pass recomputes the [B, H, L, L] scores, probabilities and mask
  (`_RematerialisedLayer`)."""
  attention = jax.nn.softmax(_scores(q_BxLxHxK, k_BxLxHxK, mask, terms), axis=-1)
  probs = _dropped_out(attention, rng, rate)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v_BxLxHxK.dtype), v_BxLxHxK)


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


class SelfAttention(nn.Module):
  """Multi-head self-attention. The attention probabilities are materialised only when asked for
  (`return_attention`), when attention dropout must be applied to them, or when decoding from a
  cache; otherwise the fused `jax.nn.dot_product_attention` computes the context without keeping
  [B, H, L, L] tensors. `cache` ([B, H, max_length, K] keys and values, and where the new tokens
  go) makes the new tokens attend over the cached ones as well; the returned k, v are then the
  updated caches. `attending`'s relative positions bias the scores: the fused kernels that take no
  bias give way to XLA's."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, attending: Attending, deterministic, return_attention=False, cache=None):
    c = self.config
    x_BxLxD = _probe(self, "input", x_BxLxD)
    b, l, _ = x_BxLxD.shape
    # [B, L, H, K]: the layout the fused kernels take; transposed to [B, H, L, K] for the outputs.
    # One product for the three projections (their parameters kept apart, as `nn.Dense`'s): x is
    # read once rather than three times, forward and backward. The three results side by side,
    # [B, L, 3, D], except on TPUs, which tile an array's last two dimensions in blocks of (8, 128)
    # and would pad the 3 to 8: there [3, B, L, D] (at the paper's 6x384 step, 1.78e11 bytes on an
    # H100 against 1.84e11 the other way; 2.28e11 on a v5e-8 against 2.55e11).
    kernels, biases = zip(
      *(_DenseParams(c.hidden_size, c, name=n)(x_BxLxD.shape[-1]) for n in ("query", "key", "value"))
    )
    dtype = DTYPES[c.dtype]
    x, kernel_3xDxD, bias_3xD = (a.astype(dtype) for a in (x_BxLxD, jnp.stack(kernels), jnp.stack(biases)))
    if compute_platform() == "tpu":
      qkv = jnp.einsum("bld,tdf->tblf", x, kernel_3xDxD) + bias_3xD[:, None, None]
      parts = [qkv[i] for i in range(3)]
    else:
      qkv = jnp.einsum("bld,tdf->bltf", x, kernel_3xDxD) + bias_3xD
      parts = [qkv[:, :, i] for i in range(3)]
    q, k, v = (_kept(part.reshape(b, l, c.num_heads, c.head_dim)) for part in parts)
    mask, terms = attending.mask, ScoreTerms(attending.positions)
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
      attention = _kept(jax.nn.softmax(_scores(q, k, mask, terms), axis=-1))
      probs = attention
      if dropout_on_probs:  # the rng the branch below draws: the same entries dropped
        probs = _dropped_out(attention, _ScopeRng(name="Dropout_0")(), c.attention_dropout)
        hidden_dropout_name = "Dropout_1"
      context = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    elif dropout_on_probs:
      # The rng of the scope an nn.Dropout here would have ("Dropout_0"); the hidden dropout after
      # it keeps its name "Dropout_1". On accelerators (and in the kernel tests) the flash kernel
      # makes the dropout mask inside from a seed drawn from that rng, so no [B, H, L, L] tensor
      # reaches HBM; elsewhere the explicit path makes the same mask from the same seed.
      rng = _ScopeRng(name="Dropout_0")()
      platform = kernel_platform() if terms.bias is None else None  # our kernel adds no bias
      if platform and mask.ndim == 2 and attention_kernel.supported(l, c.head_dim, platform):
        context = attention_kernel.flash_attention(
          q, k, v, mask, dropout_bits.seed_from_key(rng), c.attention_dropout, platform
        )
      else:
        context = _attention_with_dropout(q, k, v, mask, rng, c.attention_dropout, terms)
      hidden_dropout_name = "Dropout_1"
    else:
      context = fused_attention(q, k, v, mask, terms)
    context = _kept(context)
    out = _dense(c.hidden_size, c, "output")(_probe(self, "heads", context.reshape(b, l, c.hidden_size)))
    out = Dropout(c.hidden_dropout, name=hidden_dropout_name)(out, deterministic=deterministic)
    out = _layer_norm(c, "LayerNorm")(_kept(out + x_BxLxD))
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
  config: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, attending: Attending, deterministic, return_attention=False, cache=None):
    c = self.config
    h, (q, k, v, attention) = SelfAttention(c, name="attention")(
      x_BxLxD, attending, deterministic, return_attention, cache
    )

    pre_activation = _kept(_dense(c.intermediate_size, c, "intermediate")(h))
    y = _dense(c.hidden_size, c, "output")(_probe(self, "ffn", ACTIVATIONS[c.hidden_act](pre_activation)))
    y = Dropout(c.hidden_dropout)(y, deterministic=deterministic)
    out = _layer_norm(c, "output_LayerNorm")(_kept(y + h))
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
    layers = []
    layer = _RematerialisedLayer if not deterministic and on_accelerator() else TransformerLayer
    for i in range(c.num_layers if num_layers is None else num_layers):
      layer_cache = None if cache is None else (cache.keys[i], cache.values[i], cache.index)
      out = layer(c, name=layout.layer_name(i))(x, attending, deterministic, return_attention, layer_cache)
      layers.append(out)
      x = out.hidden
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
  """Parameter shapes and dtypes, without allocating them."""
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def extend_positions(params, length: int):
  """Encoder params whose position table covers `length` positions, the pre-trained table repeated
  (as UniLM fine-tunes CNN/DailyMail at 768 tokens on 512-position models)."""
  table = params["embeddings"]["position_embeddings"]["embedding"]
  repeats = -(-length // table.shape[0])
  extended = jnp.tile(table, (repeats, 1))[:length]
  embeddings = {**params["embeddings"], "position_embeddings": {"embedding": extended}}
  return {**params, "embeddings": embeddings}
