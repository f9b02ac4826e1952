"""MiniLM: the 12x384 teacher assistant: BERT-base depth, the students' width (section 3.3)."""

from minilm_jax.distill.config import paper_config


def get_config():
  return paper_config("bert-base-uncased", 12, 384, batch_size=256, lr=3e-4)
