"""A tiny distillation config for subprocess tests: teacher and corpus come from environment variables.
`tiny_config.py:evaluators` adds a held-out loss and WordNet retrieval, scored every 10 steps."""

import os

from conftest import WORDNET_SMALL, tiny_config
from minilm_jax.evaluation.evaluators import evaluator


def get_config(variant: str = ""):
  c = tiny_config(os.environ["TINY_TEACHER"], os.environ["TINY_CORPUS"])
  c.mesh.data = -1  # every device of the program's processes (2 unless a test or the launcher gives more)
  if variant == "evaluators":
    c.data.heldout_blocks = c.batch_size
    c.evaluators.heldout = evaluator("heldout", 10)
    c.evaluators.wordnet = evaluator("retrieval", 10, data_dir=WORDNET_SMALL)
  return c
