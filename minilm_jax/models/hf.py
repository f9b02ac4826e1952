"""Hugging Face import and export of every architecture `models.config.MODEL_TYPES` names, without
torch on the safetensors path.

`load(dir) -> LoadedModel` reads `config.json` plus `model.safetensors` (or a sharded
safetensors index, or `pytorch_model.bin` through torch's pickle-free `weights_only=True` loader).
`save(dir, config, params, tokenizer=None)` writes what `transformers.AutoModel.from_pretrained`
loads. Every encoder parameter's name crosses over through `models.layout`'s table, and nowhere else.
"""

import json
import logging
import os
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import traverse_util

from minilm_jax.errors import UserError
from minilm_jax.models import deberta, layout, modernbert
from minilm_jax.models.config import MODEL_TYPES
from minilm_jax.models.encoder import EncoderConfig, abstract_params, init_params
from minilm_jax.models.heads import HEAD_LAYOUT_CONFIG, MLM_WEIGHTS, head_kind

log = logging.getLogger(__name__)


class LoadedModel(NamedTuple):
  """A model as every loader returns it (`load` here; `runs.load_encoder`, `runs.read_run`)."""

  config: EncoderConfig
  params: dict  # the encoder's, or a fine-tuned run's task model's {"encoder": ..., <head>: ...}
  tokenizer: Any = None
  head: dict | None = None  # a fine-tuned run's task head ({"kind": ...}); None: an encoder
  mlm_head: dict | None = None  # the masked-LM head's parameters, when asked for and saved
  # A run's sentence-embedding pipeline (pooling, Dense kernel or None), when asked for: read with
  # its weights, from the same opening of its checkpoints.
  sentence_pipeline: tuple | None = None
  record: Any = None  # a run's `RunRecord`, read with its weights; None for a Hugging Face directory


# A checkpoint saved without a pooler (many MLM checkpoints) still loads: it gets a fresh one, as in transformers.
_OPTIONAL_PREFIXES = ("pooler/",)
_MODEL_PREFIXES = tuple(sorted({a.weights_prefix for a in MODEL_TYPES.values()}))
# Our EncoderConfig field <- Hugging Face config.json key.
_CONFIG_KEYS = {
  "vocab_size": "vocab_size",
  "hidden_size": "hidden_size",
  "num_layers": "num_hidden_layers",
  "num_heads": "num_attention_heads",
  "intermediate_size": "intermediate_size",
  "max_position_embeddings": "max_position_embeddings",
  "type_vocab_size": "type_vocab_size",
  "layer_norm_eps": "layer_norm_eps",
  "hidden_act": "hidden_act",
  "hidden_dropout": "hidden_dropout_prob",
  "attention_dropout": "attention_probs_dropout_prob",
  "pad_token_id": "pad_token_id",
  "initializer_range": "initializer_range",
}
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "sentencepiece.bpe.model", "vocab.json")


def _name_pairs(config: EncoderConfig):
  """Yields (our path, HF name, how, part) for every parameter of `config`'s encoder (`models.layout`;
  the rows of its architecture that its config has: DeBERTa's position maps only without shared
  keys, no norm before ModernBERT's first attention...). How: "linear" kernels are stored [in, out]
  here and [out, in] in PyTorch; everything else is copied. Part: (i, n) where the HF tensor is n
  of ours stacked (`layout.Param.part`), else None."""
  present = traverse_util.flatten_dict(abstract_params(config), sep="/")
  for ours, theirs, row in layout.named_params(config.num_layers, config.model_type):
    if ours in present:
      yield ours, theirs, "linear" if row.linear else "copy", row.part


def _ours(tensor, how: str, part):
  """One of our parameters from its Hugging Face tensor (its part of it, transposed if linear)."""
  if part is not None:
    tensor = np.split(tensor, part[1], axis=0)[part[0]]
  return tensor.T if how == "linear" else tensor


def config_from_hf(hf_config: dict, dtype: str = "float32") -> EncoderConfig:
  model_type = hf_config.get("model_type")
  if model_type not in MODEL_TYPES:
    raise UserError(f"unsupported model_type {model_type!r} in config.json: minilm_jax loads {', '.join(MODEL_TYPES)}")
  if hf_config.get("position_embedding_type", "absolute") != "absolute":
    raise UserError(
      f"unsupported position_embedding_type {hf_config['position_embedding_type']!r}: only 'absolute' is implemented"
    )
  fields = {ours: hf_config[theirs] for ours, theirs in _CONFIG_KEYS.items() if theirs in hf_config}
  architecture = MODEL_TYPES[model_type]
  if architecture.position_bias:  # MPNet: no token types, a relative-attention table
    fields.update(type_vocab_size=0, relative_attention_buckets=hf_config.get("relative_attention_num_buckets", 32))
  if architecture.disentangled_attention:
    fields.update(deberta.config_from_hf(hf_config))
  if architecture.rotary:
    fields.update(modernbert.config_from_hf(hf_config))
  return EncoderConfig(model_type=model_type, dtype=dtype, **fields)


def config_to_hf(config: EncoderConfig) -> dict:
  d = {theirs: getattr(config, ours) for ours, theirs in _CONFIG_KEYS.items()}
  architecture = config.architecture.hf_architecture
  d.update(model_type=config.model_type, architectures=[architecture], position_embedding_type="absolute")
  if config.architecture.position_bias:
    del d["type_vocab_size"]
    d["relative_attention_num_buckets"] = config.relative_attention_buckets
  if config.architecture.disentangled_attention:
    d.update(deberta.config_to_hf(config))
  if config.architecture.rotary:
    d = modernbert.config_to_hf(d, config)
  return d


def _load_safetensors(path: str) -> dict:
  from safetensors import SafetensorError
  from safetensors.numpy import load_file

  try:
    return load_file(path)
  except (SafetensorError, OSError) as e:
    raise UserError(
      f"could not read the weights file {path} ({' '.join(str(e).split())[:120]}): it is damaged or "
      f"incomplete; copy or download it again"
    ) from None


def _read_tensors(model_dir: str) -> dict:
  """All tensors of a checkpoint directory as numpy arrays, by their Hugging Face names."""
  single = os.path.join(model_dir, "model.safetensors")
  index = os.path.join(model_dir, "model.safetensors.index.json")
  torch_bin = os.path.join(model_dir, "pytorch_model.bin")
  if os.path.exists(single):
    return _load_safetensors(single)
  if os.path.exists(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    tensors = {}
    for shard in shards:
      tensors.update(_load_safetensors(os.path.join(model_dir, shard)))
    return tensors
  if os.path.exists(torch_bin):
    try:
      import torch
    except ImportError:
      raise UserError(
        f"{torch_bin} needs torch to read (pip install torch), or convert it to model.safetensors"
      ) from None
    # weights_only=True: torch's restricted unpickler, which never runs code from the file.
    state = torch.load(torch_bin, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}
  raise UserError(
    f"no weights in {model_dir}: expected model.safetensors, model.safetensors.index.json or pytorch_model.bin"
  )


def _normalise_name(name: str) -> str:
  for prefix in _MODEL_PREFIXES:
    if name.startswith(prefix):
      name = name[len(prefix) :]
  # Checkpoints from the TensorFlow era name LayerNorm parameters gamma/beta.
  return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def read_config(model_dir: str, dtype: str = "float32") -> EncoderConfig:
  if not os.path.isdir(model_dir):
    raise UserError(f"model directory {model_dir} does not exist: pass a local Hugging Face checkpoint directory")
  path = os.path.join(model_dir, "config.json")
  if not os.path.exists(path):
    raise UserError(f"{model_dir} has no config.json: it is not a Hugging Face checkpoint directory")
  with open(path) as f:
    return config_from_hf(json.load(f), dtype)


def load(model_dir: str, dtype: str = "float32", mlm_head: bool = False) -> LoadedModel:
  """A local Hugging Face BERT/RoBERTa/XLM-R directory's config and float32 encoder params, read once;
  with `mlm_head`, also its masked-LM head's parameters (None when it was saved without one).
  The tokenizer is `load_tokenizer`'s."""
  config = read_config(model_dir, dtype)
  raw = _read_tensors(model_dir)
  tensors = {_normalise_name(k): v for k, v in raw.items()}
  expected = traverse_util.flatten_dict(abstract_params(config), sep="/")
  flat, missing = {}, []
  for ours, theirs, how, part in _name_pairs(config):
    if theirs not in tensors:
      missing.append((ours, theirs))
      continue
    value = _ours(tensors[theirs], how, part)
    if value.shape != expected[ours].shape:
      implied = expected[ours].shape[::-1] if how == "linear" else expected[ours].shape
      implied = (implied[0] * part[1], *implied[1:]) if part else implied
      raise UserError(
        f"{model_dir}: tensor {theirs} has shape {tuple(tensors[theirs].shape)}, but config.json implies "
        f"{tuple(implied)}: config and weights do not match"
      )
    flat[ours] = np.asarray(value, np.float32)
  required = [theirs for ours, theirs in missing if not ours.startswith(_OPTIONAL_PREFIXES)]
  if required:
    raise UserError(
      f"{model_dir}: weights are missing {len(required)} tensors of a {config.model_type} encoder, e.g. {required[:3]}"
    )
  if set(expected) - set(flat):  # a checkpoint without a pooler (DeBERTa's never has one)
    log.info("%s has no pooler; it gets a freshly initialised one", model_dir)
    # Jitted: run eagerly, the initialising forward pass compiles each of its operations apart.
    fresh = traverse_util.flatten_dict(jax.jit(init_params, static_argnums=0)(config, jax.random.key(0)), sep="/")
    flat.update({k: np.asarray(v) for k, v in fresh.items() if k not in flat})
  params = jax.tree.map(jax.numpy.asarray, traverse_util.unflatten_dict(flat, sep="/"))
  return LoadedModel(config, params, mlm_head=_mlm_head(raw, config) if mlm_head else None)


def _convert(flat, pairs):
  """Hugging Face tensors by name of our `flat` parameters, by (ours, theirs, how, part) `pairs`
  (`_name_pairs`): the parts of a fused tensor stacked in their order."""
  out: dict = {}
  parts: dict[str, list] = {}
  for ours, theirs, how, part in pairs:
    value = np.asarray(flat[ours], np.float32)
    value = value.T if how == "linear" else value
    if part is None:
      out[theirs] = np.ascontiguousarray(value)
    else:
      parts.setdefault(theirs, [None] * part[1])[part[0]] = value
  out.update({theirs: np.ascontiguousarray(np.concatenate(stacked, axis=0)) for theirs, stacked in parts.items()})
  return out


def _mlm_head(tensors: dict, config: EncoderConfig):
  """The masked-LM head's parameters among a checkpoint's tensors, or None when it was saved without one."""
  table = MLM_WEIGHTS[config.architecture.mlm_weights]
  if any(theirs not in tensors for _, theirs, _ in table):
    return None
  flat = {
    ours: np.asarray(tensors[theirs].T if how == "linear" else tensors[theirs], np.float32)
    for ours, theirs, how in table
  }
  return jax.tree.map(jax.numpy.asarray, traverse_util.unflatten_dict(flat, sep="/"))


def to_hf_tensors(config: EncoderConfig, params, head: dict | None = None) -> dict:
  """Hugging Face tensors of encoder params, or of task-model params ({"encoder": ..., <head>: ...})."""
  flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
  if head is None:
    return _convert(flat, _name_pairs(config))
  weights = head_kind(head).hf_weights[config.architecture.head_layout]
  taken = {ours[len("encoder/") :] for ours, _, _ in weights if ours.startswith("encoder/")}  # the head's own
  encoder = {k[len("encoder/") :]: v for k, v in flat.items() if k.startswith("encoder/")}
  prefix = config.architecture.weights_prefix
  pairs = (pair for pair in _name_pairs(config) if pair[0] not in taken)
  tensors = {prefix + k: v for k, v in _convert(encoder, pairs).items()}
  tensors.update(_convert(flat, ((*pair, None) for pair in weights)))
  return tensors


def config_with_head(config: EncoderConfig, head: dict | None = None) -> dict:
  d = config_to_hf(config)
  if head is None:
    return d
  kind, layout = head_kind(head), config.architecture.head_layout
  return {
    **d,
    "architectures": [_task_class(config, head)],
    **kind.hf_config(head),
    **HEAD_LAYOUT_CONFIG.get(layout, {}),
  }


def _task_class(config: EncoderConfig, head: dict) -> str:
  """The transformers class of `config`'s architecture with `head` ("MPNet" + "ForSequenceClassification")."""
  return config.architecture.hf_architecture.removesuffix("Model") + head_kind(head).hf_class


def save(out_dir: str, config: EncoderConfig, params, tokenizer=None, head: dict | None = None):
  """Writes `config.json`, `model.safetensors` and (given a tokenizer) its files to `out_dir`. With
  `head` (a head description, `models.heads.HEADS`), `params` are a task model's and the directory
  loads as the head's transformers class (BertForSequenceClassification, ...)."""
  if head is not None and config.architecture.head_layout not in head_kind(head).hf_weights:
    raise UserError(
      f"exporting a {config.model_type} {head['kind']} head is not supported (transformers' "
      f"{_task_class(config, head)} computes another head than ours): export the encoder alone"
    )
  if head is not None:
    head_kind(head).check_params(params, head)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config_with_head(config, head), f, indent=2)
  write_safetensors(os.path.join(out_dir, "model.safetensors"), to_hf_tensors(config, params, head))
  if tokenizer is not None:
    tokenizer.save_pretrained(out_dir)


def write_safetensors(path: str, tensors: dict):
  """`tensors` (numpy arrays by name) as a PyTorch-format safetensors file at `path`, serialised
  here and written by Python: the file gets the user's umask (safetensors' own `save_file` makes it
  0600, which another account, a server's, cannot read) and a full disk is an OSError (the
  programs' one line), where safetensors' writer raises its SafetensorError."""
  from safetensors.numpy import save

  with open(path, "wb") as f:
    f.write(save(tensors, metadata={"format": "pt"}))


def load_tokenizer(model_dir: str):
  """The checkpoint's fast tokenizer, offline. Padding and truncation are chosen per call, never
  inherited from tokenizer.json (all-MiniLM-L6-v2's pads and truncates to 128 by default)."""
  from transformers import AutoTokenizer

  if not any(os.path.exists(os.path.join(model_dir, f)) for f in _TOKENIZER_FILES):
    raise UserError(
      f"{model_dir} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}): save the tokenizer beside the weights"
    )
  try:
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
  except Exception as e:  # a damaged tokenizer.json raises the Rust parser's own exception types
    raise UserError(
      f"could not load the tokenizer in {model_dir} ({type(e).__name__}: {' '.join(str(e).split())[:120]}): "
      f"its files are damaged or incomplete; save the tokenizer again"
    ) from None
  backend = getattr(tokenizer, "_tokenizer", None)
  if backend is not None:
    backend.no_padding()
    backend.no_truncation()
  return tokenizer
