"""MiniLM w/ TA: the 6x384 student distilled from the 12x384 teacher assistant (table 3, 'MiniLM (w/ TA)').

Run configs/ta_12x384.py with --workdir workdirs/ta_12x384 first; its workdir is this run's teacher.
"""

from minilm_jax.distill.config import paper_config


def get_config():
  return paper_config("workdirs/ta_12x384", 6, 384, batch_size=256, lr=3e-4)
