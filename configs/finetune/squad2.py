"""SQuAD 2.0 (supplementary section 4): max length 384, windows every 128 tokens, batch 32, lr 6e-5, 3 epochs."""

from minilm_jax.finetuning.config import squad_config


def get_config():
  return squad_config("squad2")
