"""MLQA (MiniLM table 13; supplementary section 4): train on SQuAD 1.1, select on MLQA's English dev
set, F1/EM on each language's test set. Max length 512, windows every 128 tokens, batch 32, 3
epochs, lr from {3e-5, 4e-5, 5e-5, 6e-5}."""

from minilm_jax.finetuning.config import squad_config


def get_config():
  c = squad_config("mlqa")
  c.max_seq_length = 512
  c.optimizer.lr = 5e-5
  c.grid.lrs = (3e-5, 4e-5, 5e-5, 6e-5)
  return c
