"""The encoder's parameter layout: one table that every part handling parameters by name reads.

A row names one parameter of `Encoder` (`{i}`: the layer index) and says, for each reader:
- `hf_name`, `linear`, `part`: the Hugging Face tensor it converts to (`minilm_jax.models.hf`); a
  linear kernel is stored [in, out] here and [out, in] in PyTorch; `part` (i, n): the tensor is n
  of ours stacked along PyTorch's first axis, this one the i-th (ModernBERT's fused maps).
- `shard`: how tensor parallelism splits it over the mesh's `model` axis (`minilm_jax.devices.parallel`),
  Megatron-style: "column" splits the last axis (Q/K/V and the first feed-forward matrix, by
  output), "row" the first (the attention output and second feed-forward matrix, by input; the
  word embeddings, by vocabulary); None keeps it whole.
- `etd_axes`: the index set that ETD's width extraction keeps along each axis (`distill.etd`):
  "hidden" (the layer's hidden dimensions), "heads" (the kept dimensions of every head, as Q/K/V
  columns), "ffn" (intermediate units), "input_hidden" / "output_hidden" (the hidden dimensions
  of the first / last kept layer, for the embeddings and the pooler), None (kept whole).

A new encoder architecture adds its module and its rows here (`rows`: BERT's renamed or left out by
`HF_NAMES`, plus its own, `ARCHITECTURE_PARAMS`); conversion, sharding rules and ETD follow from the
table.
"""

import dataclasses
import re
from collections.abc import Mapping

LAYER = "layer_{i}"  # the name of Transformer layer i in the encoder's parameter tree
EMBEDDINGS, POOLER = "embeddings", "pooler"
WORD_EMBEDDINGS = ("embeddings", "word_embeddings", "embedding")


@dataclasses.dataclass(frozen=True)
class Param:
  path: str
  hf_name: str
  linear: bool = False
  shard: str | None = None
  etd_axes: tuple = ("hidden",)
  part: tuple | None = None

  @property
  def per_layer(self) -> bool:
    return "{i}" in self.path


def _layer(path, hf_name, linear=False, shard=None, etd_axes=("hidden",)):
  return Param(f"{LAYER}/{path}", f"encoder.layer.{{i}}.{hf_name}", linear, shard, etd_axes)


ENCODER = (
  Param(
    "embeddings/word_embeddings/embedding",
    "embeddings.word_embeddings.weight",
    shard="row",
    etd_axes=(None, "input_hidden"),
  ),
  Param(
    "embeddings/position_embeddings/embedding", "embeddings.position_embeddings.weight", etd_axes=(None, "input_hidden")
  ),
  Param(
    "embeddings/token_type_embeddings/embedding",
    "embeddings.token_type_embeddings.weight",
    etd_axes=(None, "input_hidden"),
  ),
  Param("embeddings/LayerNorm/scale", "embeddings.LayerNorm.weight", etd_axes=("input_hidden",)),
  Param("embeddings/LayerNorm/bias", "embeddings.LayerNorm.bias", etd_axes=("input_hidden",)),
  *(
    entry
    for proj in ("query", "key", "value")
    for entry in (
      _layer(f"attention/{proj}/kernel", f"attention.self.{proj}.weight", True, "column", ("hidden", "heads")),
      _layer(f"attention/{proj}/bias", f"attention.self.{proj}.bias", shard="column", etd_axes=("heads",)),
    )
  ),
  _layer("attention/output/kernel", "attention.output.dense.weight", True, "row", ("heads", "hidden")),
  _layer("attention/output/bias", "attention.output.dense.bias"),
  _layer("attention/LayerNorm/scale", "attention.output.LayerNorm.weight"),
  _layer("attention/LayerNorm/bias", "attention.output.LayerNorm.bias"),
  _layer("intermediate/kernel", "intermediate.dense.weight", True, "column", ("hidden", "ffn")),
  _layer("intermediate/bias", "intermediate.dense.bias", shard="column", etd_axes=("ffn",)),
  _layer("output/kernel", "output.dense.weight", True, "row", ("ffn", "hidden")),
  _layer("output/bias", "output.dense.bias"),
  _layer("output_LayerNorm/scale", "output.LayerNorm.weight"),
  _layer("output_LayerNorm/bias", "output.LayerNorm.bias"),
  Param("pooler/kernel", "pooler.dense.weight", linear=True, etd_axes=("output_hidden", "output_hidden")),
  Param("pooler/bias", "pooler.dense.bias", etd_axes=("output_hidden",)),
)
# Each architecture's Hugging Face names where they are not BERT's, by our path; None: a parameter it
# does not have. MPNet names its attention `attn.q/k/v/o`, its layer norm after attention
# `attention.LayerNorm`, and has no token types.
_MPNET_LAYER = {
  **{f"attention/{ours}/{kind}": f"attention.attn.{theirs}.{name}"
     for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("output", "o"))
     for kind, name in (("kernel", "weight"), ("bias", "bias"))},
  "attention/LayerNorm/scale": "attention.LayerNorm.weight",
  "attention/LayerNorm/bias": "attention.LayerNorm.bias",
}  # fmt: skip
# ModernBERT's layers are `layers.{i}`: one fused Q/K/V map (`attn.Wqkv`) and one fused map of the
# gated block's two halves (`mlp.Wi`: the activated half first), norms before the blocks
# (`attn_norm`, none in layer 0; `mlp_norm`), no biases; its embeddings are `tok_embeddings` and
# `norm`, without positions or token types; no pooler.
_MODERNBERT = {
  "embeddings/word_embeddings/embedding": "embeddings.tok_embeddings.weight",
  "embeddings/LayerNorm/scale": "embeddings.norm.weight",
  f"{LAYER}/attention/output/kernel": "layers.{i}.attn.Wo.weight",
  f"{LAYER}/attention/LayerNorm/scale": "layers.{i}.attn_norm.weight",
  f"{LAYER}/intermediate/kernel": "layers.{i}.mlp.Wi.weight",
  f"{LAYER}/output/kernel": "layers.{i}.mlp.Wo.weight",
  f"{LAYER}/output_LayerNorm/scale": "layers.{i}.mlp_norm.weight",
  **{f"{LAYER}/attention/{p}/kernel": "layers.{i}.attn.Wqkv.weight" for p in ("query", "key", "value")},
}
HF_NAMES = {
  "mpnet": {
    "embeddings/token_type_embeddings/embedding": None,
    **{f"{LAYER}/{ours}": f"encoder.layer.{{i}}.{theirs}" for ours, theirs in _MPNET_LAYER.items()},
  },
  # DeBERTa's projections are `query_proj`...; it has no pooler (its classifier pools on its own).
  "deberta-v2": {
    **{f"{LAYER}/attention/{p}/{kind}": f"encoder.layer.{{i}}.attention.self.{p}_proj.{name}"
       for p in ("query", "key", "value") for kind, name in (("kernel", "weight"), ("bias", "bias"))},
    "pooler/kernel": None,
    "pooler/bias": None,
  },
  "modernbert": {p.path: _MODERNBERT.get(p.path) for p in ENCODER},
}  # fmt: skip
# The part of a fused Hugging Face tensor each of ours is (`Param.part`), by architecture.
_PARTS = {
  "modernbert": {
    **{f"{LAYER}/attention/{p}/kernel": (i, 3) for i, p in enumerate(("query", "key", "value"))},
    f"{LAYER}/intermediate/kernel": (0, 2),
  },
}
# Parameters of one architecture alone: MPNet's relative-attention bias, [buckets, heads], shared by
# its layers (ETD keeps every head, so the table whole).
ARCHITECTURE_PARAMS = {
  "mpnet": (
    Param("relative_attention_bias/embedding", "encoder.relative_attention_bias.weight", etd_axes=(None, None)),
  ),
  # DeBERTa's relative embeddings and their layer norm, shared by the layers; its layers' own position
  # maps (without `share_att_key`); its word embeddings' projection (`embedding_size`). Rows a
  # checkpoint's config does not ask for are not in its parameters, and are left out (`hf._name_pairs`).
  "deberta-v2": (
    Param("relative_embeddings/embedding", "encoder.rel_embeddings.weight", etd_axes=(None, "input_hidden")),
    Param("relative_embeddings/LayerNorm/scale", "encoder.LayerNorm.weight", etd_axes=("input_hidden",)),
    Param("relative_embeddings/LayerNorm/bias", "encoder.LayerNorm.bias", etd_axes=("input_hidden",)),
    Param("embeddings/embed_proj/kernel", "embeddings.embed_proj.weight", linear=True, etd_axes=(None, "input_hidden")),
    *(
      entry
      for ours, theirs in (("pos_key", "pos_key_proj"), ("pos_query", "pos_query_proj"))
      for entry in (
        _layer(f"attention/{ours}/kernel", f"attention.self.{theirs}.weight", True, "column", ("hidden", "heads")),
        _layer(f"attention/{ours}/bias", f"attention.self.{theirs}.bias", shard="column", etd_axes=("heads",)),
      )
    ),
  ),
  # ModernBERT's gate (the second half of `mlp.Wi`, taken with the same units as the first) and the
  # norm after its last layer.
  "modernbert": (
    Param(f"{LAYER}/gate/kernel", "layers.{i}.mlp.Wi.weight", True, "column", ("hidden", "ffn"), part=(1, 2)),
    Param("final_norm/scale", "final_norm.weight", etd_axes=("output_hidden",)),
  ),
}
_BY_PATH = {p.path: p for p in (*ENCODER, *(p for extra in ARCHITECTURE_PARAMS.values() for p in extra))}
_LAYER_INDEX = re.compile(r"layer_\d+")


def layer_name(i: int) -> str:
  return LAYER.format(i=i)


def num_layers(encoder_params: dict) -> int:
  return sum(1 for name in encoder_params if _LAYER_INDEX.fullmatch(name))


def first_layers(encoder_params: dict, n: int) -> dict:
  """The embeddings, the first `n` layers and the pooler of an encoder's parameters."""
  keep = {EMBEDDINGS, POOLER, *(layer_name(i) for i in range(n))}
  return {k: v for k, v in encoder_params.items() if k in keep}


def word_embeddings(encoder_params: Mapping):
  """The [vocab, hidden] word-embedding matrix (the tied output layer of a masked-LM head)."""
  x = encoder_params
  for key in WORD_EMBEDDINGS:
    x = x[key]
  return x


def rows(model_type: str = "bert") -> tuple:
  """The rows of an encoder of `model_type`: BERT's, with its own names (`HF_NAMES`) and parameters
  (`ARCHITECTURE_PARAMS`)."""
  renamed, parts = HF_NAMES.get(model_type, {}), _PARTS.get(model_type, {})
  kept = (dataclasses.replace(p, hf_name=renamed.get(p.path, p.hf_name), part=parts.get(p.path)) for p in ENCODER)
  return (*(p for p in kept if p.hf_name is not None), *ARCHITECTURE_PARAMS.get(model_type, ()))


def param_rows(model_type: str, params: Mapping) -> tuple:
  """The rows of the parameters an encoder of `model_type` has in `params` (flat, by our paths), its
  Hugging Face names aside: a DeBERTa's pooler, which transformers' has not, included."""
  rows_of_type = (*ENCODER, *ARCHITECTURE_PARAMS.get(model_type, ()))
  layers = {m.group() for m in map(_LAYER_INDEX.match, params) if m}
  # A row of a layer's is present when any layer has it (ModernBERT's first layer has no attention norm).
  present = lambda p: (
    any(p.path.replace(LAYER, layer) in params for layer in layers) if p.per_layer else p.path in params
  )
  return tuple(p for p in rows_of_type if present(p))


def named_params(num_layers: int, model_type: str = "bert"):
  """Yields (our path, Hugging Face name, row) for every parameter of a `num_layers` encoder."""
  for p in rows(model_type):
    for i in range(num_layers) if p.per_layer else (0,):
      yield p.path.format(i=i), p.hf_name.format(i=i), p


def find(path: str) -> Param | None:
  """The row of a parameter anywhere in a tree ("params/encoder/layer_3/attention/query/kernel",
  an optimizer moment of it, a multi-task body's ...), or None for what is not the encoder's."""
  parts = _LAYER_INDEX.sub(LAYER, path).split("/")
  for start in range(len(parts)):
    row = _BY_PATH.get("/".join(parts[start:]))
    if row is not None:
      return row
  return None
