"""Multilingual MiniLM 12x384 from xlm-roberta-base (section 4.1: batch 256, lr 3e-4, 1M steps)."""

from minilm_jax.distill.config import multilingual, paper_config


def get_config():
  return multilingual(paper_config("xlm-roberta-base", 12, 384, batch_size=256, lr=3e-4, num_steps=1_000_000))
