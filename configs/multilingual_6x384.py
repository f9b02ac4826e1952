"""Multilingual MiniLM 6x384 w/ TA (section 5.3; tables 11 and 13, row "MiniLM (w/ TA)"): distilled
from the 12x384 multilingual student as its teacher assistant, not straight from xlm-roberta-base
(section 4.1: batch 512, lr 6e-4, 400k steps). The chain:

  python -m minilm_jax.train --config configs/multilingual_12x384.py --workdir workdirs/multilingual_12x384
  python -m minilm_jax.train --config configs/multilingual_6x384.py --workdir workdirs/multilingual_6x384

The assistant's workdir is this run's teacher (its weights, XLM-R's tokenizer and vocabulary). Both
read the same corpus, Wikipedia in XNLI's 15 languages sampled with alpha 0.3 (see
configs/multilingual_12x384.py for the offline override with local files per language).
"""

from minilm_jax.distill.config import multilingual, paper_config


def get_config():
  return multilingual(paper_config("workdirs/multilingual_12x384", 6, 384, batch_size=512, lr=6e-4))
