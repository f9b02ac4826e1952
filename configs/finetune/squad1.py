"""SQuAD 1.1 (ETD's tables), with SQuAD 2.0's settings: max length 384, windows every 128 tokens,
batch 32, lr 6e-5, 3 epochs."""

from minilm_jax.finetuning.config import squad_config


def get_config():
  return squad_config("squad1")
