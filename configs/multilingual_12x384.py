"""Multilingual MiniLM 12x384 from xlm-roberta-base (section 4.1: batch 256, lr 3e-4, 1M steps).

The corpus: Wikipedia in XNLI's 15 languages from the hub, language i sampled with probability
proportional to (its share of the blocks)^0.3 as XLM-R samples CC-100 (`distill.config.multilingual`).
Offline, with CC-100 (or any text) as one local file per language:

  python -m minilm_jax.train --config configs/multilingual_12x384.py --workdir workdirs/multilingual_12x384 \
      --config.data.corpus=cc100/{lang}.txt --config.data.corpus_config=

Fewer languages: --config.data.languages=en,de,zh; the languages in their corpus shares:
--config.data.language_alpha=1.
"""

from minilm_jax.distill.config import multilingual, paper_config


def get_config():
  return multilingual(paper_config("xlm-roberta-base", 12, 384, batch_size=256, lr=3e-4, num_steps=1_000_000))
