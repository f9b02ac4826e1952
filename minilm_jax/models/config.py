"""An encoder's architecture (`EncoderConfig`): the model types it may be (`MODEL_TYPES`: the BERT
family, MPNet, DeBERTa v2/v3 and ModernBERT, each an `Architecture`), activations and compute
dtypes, checked when it is made;
`minilm_jax.models.hf` maps Hugging Face's names to ours."""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from minilm_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Architecture:
  """What differs between the encoder architectures we load, by Hugging Face model type
  (`EncoderConfig.model_type`): every one is a Transformer whose layers hand back their queries,
  keys and values; these fields say how each numbers its positions, whether it biases its
  attention scores by relative position or rotates its queries and keys, where its layer norms
  sit, and how its weights are named and exported (`models.layout`'s names by architecture)."""

  positions_after_padding: bool  # RoBERTa, XLM-R, MPNet number real positions from padding_idx + 1; BERT from 0
  hf_architecture: str  # the transformers class of the encoder alone
  mlm_weights: str  # the Hugging Face layout of its masked-LM head (`heads.MLM_WEIGHTS`)
  head_layout: str  # how its transformers task models name our task heads' weights (`HeadKind.hf_weights`)
  position_bias: bool = False  # MPNet's learned bias of the scores by bucketed relative position (`models.mpnet`)
  disentangled_attention: bool = False  # DeBERTa's c2p and p2c terms of the scores (`models.deberta`)
  weights_prefix: str = "bert."  # what transformers' task models put before the encoder's weights
  masks_embeddings: bool = False  # DeBERTa zeroes the padding's embeddings
  # ModernBERT (`models.modernbert`): a layer norm before each block rather than after it (none before
  # the first layer's attention, one after the last layer); rotary positions, and layers that attend
  # within a sliding window; a gated (GeGLU) feed-forward block; no biases in its maps or norms.
  pre_norm: bool = False
  rotary: bool = False
  gated_mlp: bool = False
  biases: bool = True


MODEL_TYPES = {
  "bert": Architecture(False, "BertModel", "bert", "bert"),
  "roberta": Architecture(True, "RobertaModel", "roberta", "roberta", weights_prefix="roberta."),
  "xlm-roberta": Architecture(True, "XLMRobertaModel", "roberta", "roberta", weights_prefix="roberta."),
  "mpnet": Architecture(True, "MPNetModel", "roberta", "roberta", position_bias=True, weights_prefix="mpnet."),
  "deberta-v2": Architecture(
    False,
    "DebertaV2Model",
    "bert",
    "deberta",
    disentangled_attention=True,
    weights_prefix="deberta.",
    masks_embeddings=True,
  ),
  "modernbert": Architecture(
    False,
    "ModernBertModel",
    "bert",
    "",  # its task models norm the pooled vector (`ModernBertPredictionHead`), which ours do not
    weights_prefix="model.",
    pre_norm=True,
    rotary=True,
    gated_mlp=True,
    biases=False,
  ),
}
MPNET_BUCKETS = 32  # transformers' MPNet buckets relative positions into 32 (`models.mpnet`)


def exact_gelu(x):
  """BERT's GELU, x * Phi(x), written with erf as PyTorch's BERT writes it, not with `nn.gelu`'s erfc:
  XLA's GPU compiler splits erfc's long expansion from its argument and writes the argument,
  [tokens, intermediate], to HBM and reads it back in every layer (3.3e10 of the 2.2e11 bytes the
  6x384 step moved at 256 x 512); erf's expansion fuses whole. The two agree to float rounding (1 + erf
  cancels below x = -5, where the value is under 1e-6)."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(0.7071067811865476, x.dtype)))


ACTIVATIONS = {
  "gelu": exact_gelu,
  "gelu_new": lambda x: nn.gelu(x, approximate=True),
  "relu": nn.relu,
}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# Fields one architecture alone sets, and their value elsewhere (`EncoderConfig.to_dict`).
# What a model type's checkpoints hold where ours default otherwise: a stand-in encoder of the type
# (`EncoderConfig.of_type`) has them.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
  "mpnet": {"relative_attention_buckets": MPNET_BUCKETS, "type_vocab_size": 0},
  "deberta-v2": {"type_vocab_size": 0, "absolute_positions": False},
  # ModernBERT-base's: a 128-token window, every third layer global, rotary bases 160,000 and 10,000.
  "modernbert": {
    "type_vocab_size": 0,
    "absolute_positions": False,
    "max_position_embeddings": 8192,
    "layer_norm_eps": 1e-5,
    "local_window": 128,
    "rope_theta": 160_000.0,
    "local_rope_theta": 10_000.0,
  },
}
_ARCHITECTURE_FIELDS = {
  "relative_attention_buckets": 0,
  "embedding_size": 0,
  "absolute_positions": True,
  "relative_terms": "",
  "position_buckets": 0,
  "max_relative_positions": 0,
  "share_position_keys": False,
  "norm_relative_embeddings": False,
  "local_window": 0,
  "sliding_layers": (),
  "rope_theta": 0.0,
  "local_rope_theta": 0.0,
}
GLOBAL_EVERY = 3  # ModernBERT's default `global_attn_every_n_layers`: layers 0, 3, 6... attend globally


def default_sliding_layers(num_layers: int) -> tuple:
  """The sliding layers of a ModernBERT of `num_layers`: all but every `GLOBAL_EVERY`-th, from the first."""
  return tuple(i for i in range(num_layers) if i % GLOBAL_EVERY)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Architecture of one encoder. Field names are ours; `minilm_jax.models.hf` maps HF's names."""

  vocab_size: int = 30522
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  model_type: str = "bert"
  pad_token_id: int = 0
  initializer_range: float = 0.02
  dtype: str = "float32"
  relative_attention_buckets: int = 0  # rows of the relative-attention bias table (MPNet's); 0: none
  # DeBERTa's (`models.deberta`): the word embeddings' width (0: hidden_size), absolute positions or
  # none, the disentangled terms ("c2p,p2c"), log buckets of relative positions (0: exact) up to
  # `max_relative_positions` (0: no relative attention), the layers' own key and query maps for the
  # relative embeddings or their own position maps, the relative embeddings layer-normed.
  embedding_size: int = 0
  absolute_positions: bool = True
  relative_terms: str = ""
  position_buckets: int = 0
  max_relative_positions: int = 0
  share_position_keys: bool = False
  norm_relative_embeddings: bool = False
  # ModernBERT's (`models.modernbert`): the sliding window's width in tokens (`local_attention`: a
  # token sees those within half of it on either side), the layers that attend within it (the others
  # attend globally), and the rotary bases of the global and the sliding layers.
  local_window: int = 0
  sliding_layers: tuple = ()
  rope_theta: float = 0.0
  local_rope_theta: float = 0.0

  def __post_init__(self):
    object.__setattr__(self, "sliding_layers", tuple(self.sliding_layers))  # a list from JSON
    if self.model_type not in MODEL_TYPES:
      raise UserError(f"unsupported model_type {self.model_type!r}: minilm_jax supports {', '.join(MODEL_TYPES)}")
    if self.architecture.position_bias and self.relative_attention_buckets < MPNET_BUCKETS:
      raise UserError(
        f"{self.model_type} with relative_attention_num_buckets={self.relative_attention_buckets}: transformers "
        f"buckets relative positions into {MPNET_BUCKETS}, so the table needs at least that many rows"
      )
    if self.local_window % 2:
      raise UserError(
        f"{self.model_type} local_attention={self.local_window}: the sliding window is a token's "
        f"neighbours on both sides and must be even; use {self.local_window + 1}"
      )
    if self.hidden_size % self.num_heads:
      raise UserError(
        f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}: "
        f"choose a head count that divides it"
      )
    if self.hidden_act not in ACTIVATIONS:
      raise UserError(f"unsupported hidden_act {self.hidden_act!r}: use one of {', '.join(ACTIVATIONS)}")
    if self.dtype not in DTYPES:
      raise UserError(f"unsupported dtype {self.dtype!r}: use one of {', '.join(DTYPES)}")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def score_scale(self) -> float:
    """What the attention scores are divided by: sqrt(head_dim), times the count of score terms
    (DeBERTa's content term and its c2p and p2c terms) under the root."""
    terms = 1 + len([t for t in self.relative_terms.split(",") if t])
    return float(np.sqrt(np.float32(self.head_dim) * np.float32(terms)))

  @property
  def architecture(self) -> Architecture:
    return MODEL_TYPES[self.model_type]

  @property
  def position_offset(self) -> int:
    """RoBERTa and XLM-R number real positions from padding_idx + 1; BERT from 0."""
    return self.pad_token_id + 1 if self.architecture.positions_after_padding else 0

  def check_length(self, length: int, field: str, model: str = "the model"):
    """One line when sequences of `length` (the config's `field`) need more positions than `model` has."""
    if length > self.max_position_embeddings:
      raise UserError(f"{field}={length} exceeds {model}'s {self.max_position_embeddings} positions: lower it")

  @classmethod
  def of_type(cls, model_type: str, **fields) -> "EncoderConfig":
    """An encoder of `model_type` with what its checkpoints hold where ours default otherwise
    (ModernBERT's: every third layer global, from the first)."""
    fields = {**_TYPE_DEFAULTS.get(model_type, {}), **fields}
    if MODEL_TYPES.get(model_type, MODEL_TYPES["bert"]).rotary and "sliding_layers" not in fields:
      fields["sliding_layers"] = default_sliding_layers(fields.get("num_layers", cls.num_layers))
    return cls(model_type=model_type, **fields)

  def replace(self, **changes) -> "EncoderConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    """Its fields; those of one architecture alone only where they are set, so the records of the
    other architectures stay as they were written before it."""
    d = dataclasses.asdict(self)
    return {k: v for k, v in d.items() if not (k in _ARCHITECTURE_FIELDS and v == _ARCHITECTURE_FIELDS[k])}

  @classmethod
  def from_dict(cls, d: dict) -> "EncoderConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise UserError(f"unknown encoder config fields {unknown}: known fields are {sorted(known)}")
    return cls(**d)
