"""Multilingual MiniLM 6x384 from xlm-roberta-base (section 4.1: batch 512, lr 6e-4, 400k steps)."""

from minilm_jax.distill.config import multilingual, paper_config


def get_config():
  return multilingual(paper_config("xlm-roberta-base", 6, 384, batch_size=512, lr=6e-4))
