"""Sentence embeddings as sentence-transformers computes them: an encoder's last hidden states,
pooled (the mean of the real tokens, or `[CLS]`), optionally mapped by a Dense layer (a student
narrower than its teacher), optionally L2-normalised.

`Pooling` is read from a sentence-transformers directory (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`: all-MiniLM-L6-v2 is mean-pooled and normalised) and written back, with
the Dense layer, by `save_sentence_transformers`, so that `SentenceTransformer(dir)` computes
exactly what `sentence_embeddings` does.
"""

import dataclasses
import json
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from minilm_jax.errors import UserError
from minilm_jax.models.hf import write_safetensors


def _mean_of_real_tokens(hidden_BxLxD, mask_BxL):
  mask = mask_BxL.astype(jnp.float32)[..., None]
  return jnp.sum(hidden_BxLxD * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1e-9)


# Pooling.mode -> (how it pools [B, L, D] float32 hidden states with the mask, sentence-transformers'
# name for it: its Pooling config's `pooling_mode_<name>` flag). The modes we reproduce.
POOLING_MODES = {
  "mean": (_mean_of_real_tokens, "mean_tokens"),
  "cls": (lambda hidden_BxLxD, mask_BxL: hidden_BxLxD[:, 0], "cls_token"),
}
_ST_POOLING_NAMES = ("mean_tokens", "cls_token", "max_tokens", "mean_sqrt_len_tokens")  # every mode it has
_ST_TYPE = "sentence_transformers.models."  # the module names every sentence-transformers release reads


@dataclasses.dataclass(frozen=True)
class Pooling:
  mode: str = "mean"
  normalize: bool = False
  max_seq_length: int = 256

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "Pooling":
    return cls(**{k: d[k] for k in ("mode", "normalize", "max_seq_length") if k in d})


def read_pipeline(model_dir: str, default_length: int):
  """(pooling, Dense kernel [D, D'] or None) of a sentence-transformers directory; of any other
  model, mean pooling without normalisation (sentence-transformers' own default for a plain
  encoder) at `default_length`. Pipelines other than Transformer -> Pooling (mean or CLS) ->
  Dense (no bias, no activation: what `save_sentence_transformers` writes) -> Normalize are refused."""
  modules_file = os.path.join(model_dir, "modules.json")
  if not os.path.isfile(modules_file):
    return Pooling(max_seq_length=default_length), None
  with open(modules_file) as f:
    modules = json.load(f)
  types = [m["type"].rsplit(".", 1)[-1] for m in modules]
  unknown = sorted(set(types) - set(_MODULE_READERS))
  if unknown:
    raise UserError(
      f"{model_dir}'s sentence-transformers pipeline has modules {unknown} that we do not reproduce: "
      f"use a model made of Transformer, Pooling, Dense and Normalize"
    )
  read: dict[str, Any] = {"mode": "mean", "dense": None}
  for module_type, module in zip(types, modules):
    reader = _MODULE_READERS[module_type]
    if reader is not None:
      folder = os.path.join(model_dir, module["path"])
      read.update(reader(model_dir, folder, _read_json(os.path.join(folder, "config.json"))))
  length = default_length
  if os.path.isfile(os.path.join(model_dir, "sentence_bert_config.json")):
    length = _read_json(os.path.join(model_dir, "sentence_bert_config.json")).get("max_seq_length", default_length)
  return Pooling(mode=read["mode"], normalize="Normalize" in types, max_seq_length=length), read["dense"]


def _read_pooling(model_dir: str, folder: str, config: dict) -> dict:
  modes = [m for m in _ST_POOLING_NAMES if config.get(f"pooling_mode_{m}")]
  ours = {st_name: mode for mode, (_, st_name) in POOLING_MODES.items()}
  if len(modes) != 1 or modes[0] not in ours:
    raise UserError(f"{model_dir} pools by {modes}: we reproduce {' or '.join(POOLING_MODES)} pooling alone")
  return {"mode": ours[modes[0]]}


def _read_dense(model_dir: str, folder: str, config: dict) -> dict:
  if config.get("bias", True) or not config.get("activation_function", "").endswith("Identity"):
    raise UserError(f"{model_dir}'s Dense module has a bias or an activation: we reproduce a linear map alone")
  return {"dense": load_file(os.path.join(folder, "model.safetensors"))["linear.weight"].T}


# The sentence-transformers modules we reproduce, and what each one's folder sets (None: nothing to
# read; the Transformer is the encoder itself, Normalize a flag).
_MODULE_READERS = {"Transformer": None, "Pooling": _read_pooling, "Dense": _read_dense, "Normalize": None}


def pool(hidden_BxLxD, mask_BxL, mode: str):
  """The pooled hidden states by `POOLING_MODES[mode]` (the mean of the real tokens', or the
  `[CLS]` (first) token's); float32."""
  return POOLING_MODES[mode][0](hidden_BxLxD.astype(jnp.float32), mask_BxL)


def sentence_embeddings(hidden_BxLxD, mask_BxL, pooling: Pooling, dense_kernel=None):
  """[B, D'] embeddings: pooled, through the Dense layer's kernel [D, D'] when given, then normalised
  if `pooling` says so (with sentence-transformers' epsilon)."""
  x = pool(hidden_BxLxD, mask_BxL, pooling.mode)
  if dense_kernel is not None:
    x = x @ dense_kernel
  if pooling.normalize:
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  return x


def _cosine_distance(student_BxD, teacher_BxD):
  cos = jnp.sum(student_BxD * teacher_BxD, axis=-1) / jnp.maximum(
    jnp.linalg.norm(student_BxD, axis=-1) * jnp.linalg.norm(teacher_BxD, axis=-1), 1e-12
  )
  return jnp.mean(1.0 - cos)


# loss.embedding_loss -> (student [B, D], teacher [B, D]) -> scalar. "mse": the squared distance
# summed over features, averaged over sentences (for normalised embeddings 2 - 2 cos, on the scale
# of the relation KLs); "cosine": 1 - cos, averaged.
EMBEDDING_LOSSES = {
  "mse": lambda student_BxD, teacher_BxD: jnp.mean(jnp.sum((student_BxD - teacher_BxD) ** 2, axis=-1)),
  "cosine": _cosine_distance,
}


def save_sentence_transformers(out_dir: str, pooling: Pooling, dense_kernel=None, *, width: int):
  """The sentence-transformers files beside a Hugging Face encoder in `out_dir`: `modules.json`,
  `1_Pooling/`, `2_Dense/` (the learned map to the teacher's width, when there is one), a
  Normalize module when the embeddings are normalised, `sentence_bert_config.json` and
  `config_sentence_transformers.json`."""
  modules = [("Transformer", "")]
  _write_json(
    os.path.join(out_dir, "1_Pooling", "config.json"),
    {
      "word_embedding_dimension": width,
      **{f"pooling_mode_{name}": name == POOLING_MODES[pooling.mode][1] for name in _ST_POOLING_NAMES},
    },
  )
  modules.append(("Pooling", "1_Pooling"))
  if dense_kernel is not None:
    kernel = np.asarray(dense_kernel, np.float32)
    _write_json(
      os.path.join(out_dir, "2_Dense", "config.json"),
      {
        "in_features": kernel.shape[0],
        "out_features": kernel.shape[1],
        "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity",
      },
    )
    write_safetensors(
      os.path.join(out_dir, "2_Dense", "model.safetensors"), {"linear.weight": np.ascontiguousarray(kernel.T)}
    )
    modules.append(("Dense", "2_Dense"))
  if pooling.normalize:
    modules.append(("Normalize", f"{len(modules)}_Normalize"))
  _write_json(
    os.path.join(out_dir, "modules.json"),
    [{"idx": i, "name": str(i), "path": path, "type": _ST_TYPE + kind} for i, (kind, path) in enumerate(modules)],
  )
  _write_json(
    os.path.join(out_dir, "sentence_bert_config.json"),
    {"max_seq_length": pooling.max_seq_length, "do_lower_case": False},
  )
  _write_json(
    os.path.join(out_dir, "config_sentence_transformers.json"),
    {"model_type": "SentenceTransformer", "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
  )


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(value, f, indent=2)
