"""MKD-Transformer (thesis section 4.1.3): a 3-layer Transformer initialised from the first three
layers of an encoder, the [CLS] vectors of its layers averaged, distilled from several tasks at once.

  python -m minilm_jax.distill_task --config configs/task/mkd_transformer.py --workdir <dir> \
      --config.teacher=<fine-tuning run of each task, comma separated> [--config.student.init=<pre-trained encoder>]

The thesis initialises from pre-trained BERT-base (`student.init`); by default the first teacher's
encoder. Otherwise section 4.3.2's settings, as MKD-LSTM.
"""

from minilm_jax.task_distill.config import mkd_config


def get_config():
  c = mkd_config()
  c.student.kind = "transformer"
  c.student.num_layers = 3
  return c
