"""Fine-tuning on WordNet's noun supersenses (`apt-get install wordnet-base`) with evaluators while it
trains: the task's dev metrics and a frozen probe of the encoder's sentence embeddings every 50
steps and at step 0, the step with the best dev accuracy kept beside the newest.

  python -m minilm_jax.finetune --config configs/finetune/wordnet_supersense.py --workdir <dir> \
      --config.init=<run workdir or HF dir>

`bench students`' length and rate (64 tokens, 1e-4).
"""

from minilm_jax.evaluation.evaluators import evaluator
from minilm_jax.finetuning.config import base_config


def get_config():
  c = base_config()
  c.task, c.max_seq_length, c.optimizer.lr = "wordnet_supersense", 64, 1e-4
  c.evaluators.task = evaluator("task", 50)
  c.evaluators.probe = evaluator("probe", 50, task="wordnet_supersense")
  c.checkpoint.best = "task/dev/accuracy"
  return c
