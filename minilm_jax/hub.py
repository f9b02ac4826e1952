"""Models named by the Hugging Face hub: a name that is not a local path is downloaded (online)."""

import os

from minilm_jax.errors import UserError


def _download(name: str) -> str:
  from huggingface_hub import snapshot_download

  try:
    return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
  except Exception as e:  # offline, unknown repository, ...: the hub's exception types vary by version
    raise UserError(
      f"{name!r} is not a local directory and could not be fetched from the hub "
      f"({type(e).__name__}): pass a local Hugging Face directory or a run's workdir"
    ) from None


def local_dir(path: str, what: str = "model") -> str:
  """`path` when it exists; a hub name's downloaded snapshot (online); else one line naming `what`."""
  if os.path.exists(path):
    return path
  if not path or path.startswith((".", "/", "~")) or path.count("/") > 1:
    raise UserError(f"{what} {path} does not exist: pass a Hugging Face directory or a run's workdir")
  return _download(path)
