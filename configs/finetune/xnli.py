"""XNLI (supplementary section 4): max length 128, batch 128, 5 epochs, lr from {3e-5, 4e-5, 5e-5, 6e-5}.

Train on English MNLI-format data, evaluate on XNLI's dev file: accuracy overall and per language.
"""

from minilm_jax.finetuning.config import base_config


def get_config():
  c = base_config()
  c.task = "xnli"
  c.batch_size = 128
  c.epochs = 5
  c.optimizer.lr = 5e-5
  c.grid.lrs = (3e-5, 4e-5, 5e-5, 6e-5)
  c.grid.epochs = (5,)
  return c
