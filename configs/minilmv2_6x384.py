"""MiniLMv2: Q-Q, K-K, V-V self-attention relations with 48 relation heads, 6x384 student from BERT-base."""

from minilm_jax.distill.config import paper_config


def get_config():
  c = paper_config("bert-base-uncased", 6, 384, batch_size=256, lr=3e-4)
  c.loss.relations = "minilmv2"
  c.loss.num_relation_heads = 48
  return c
