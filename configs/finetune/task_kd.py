"""The second stage (TinyBERT's two stages, the thesis's task distillation): a general student
fine-tuned on a fine-tuned teacher's logits and layers over the task's training set augmented 10x,
with `bench students`' fine-tuning protocol (length 64, batch 32, AdamW 1e-4, 3 epochs).

  python -m minilm_jax.finetune --config configs/finetune/task_kd.py --workdir <dir> \
      --config.task=<classification task> --config.init=<the student: a distillation run> \
      --config.distill.teacher=<a fine-tuning run of the task>

`--config.distill.layers=''`: the logits alone; `--config.augment.enabled=false`: the training set
alone. The augmented set and the teacher's logits are cached in <dir>/cache (`distill.cache_dir`).
"""

from minilm_jax.finetuning.config import base_config


def get_config():
  c = base_config()
  c.max_seq_length, c.optimizer.lr = 64, 1e-4
  c.distill.layers = "tinybert_layerwise"
  c.augment.enabled = True
  return c
