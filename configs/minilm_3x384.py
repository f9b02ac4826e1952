"""MiniLM: the 3x384 student from BERT-base (table 3)."""

from minilm_jax.distill.config import paper_config


def get_config():
  return paper_config("bert-base-uncased", 3, 384, batch_size=256, lr=3e-4)
