"""MiniLM: the 6x768 student from BERT-base (table 2)."""

from minilm_jax.distill.config import paper_config


def get_config():
  return paper_config("bert-base-uncased", 6, 768, batch_size=1024, lr=5e-4)
