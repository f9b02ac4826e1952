"""Finding a teacher: a Hugging Face directory, a hub name (when online), or an earlier run's workdir."""

import os

from minilm_jax import checkpoint, hf
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import Encoder, EncoderConfig, abstract_params

TOKENIZER_DIR = "tokenizer"  # inside a run's workdir: the tokenizer its students and teachers share


def _download(name: str) -> str:
  from huggingface_hub import snapshot_download

  try:
    return snapshot_download(name, allow_patterns=["config.json", "*.safetensors", "*.json", "*.txt", "*.model"])
  except Exception as e:  # offline, unknown repository, ...
    raise UserError(f"teacher {name!r} is not a local directory and could not be fetched from the hub "
                    f"({type(e).__name__}): pass a local Hugging Face directory or a run's workdir") from None


def load_teacher(path: str, dtype: str):
  """Returns (Encoder, params, tokenizer) of the teacher named by `path`."""
  if not path:
    raise UserError("teacher.path is empty: set --config.teacher.path to a Hugging Face directory or a run's workdir")
  if checkpoint.is_run(path):
    ckpt = checkpoint.RunCheckpoints(path, read_only=True)
    config = EncoderConfig.from_dict({**ckpt.read_meta()["student"], "dtype": dtype})
    params = ckpt.restore_params(abstract_params(config))
    ckpt.close()
    return Encoder(config), params, hf.load_tokenizer(os.path.join(path, TOKENIZER_DIR))
  if not os.path.exists(path):
    if path.startswith((".", "/", "~")) or path.count("/") > 1:
      raise UserError(f"teacher path {path} does not exist: set teacher.path to a Hugging Face directory or a run's workdir")
    path = _download(path)
  model, params = hf.load(path, dtype)
  return model, params, hf.load_tokenizer(path)
