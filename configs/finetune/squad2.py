"""SQuAD 2.0 (supplementary section 4): max length 384, windows every 128 tokens, batch 32, lr 6e-5, 3 epochs."""

from minilm_jax.tasks.config import base_config


def get_config():
  c = base_config()
  c.task = "squad2"
  c.max_seq_length = 384
  c.batch_size = 32
  c.eval_batch_size = 64
  c.epochs = 3
  c.optimizer.lr = 6e-5
  c.grid.lrs = (4e-5, 6e-5)
  c.grid.epochs = (3,)
  return c
