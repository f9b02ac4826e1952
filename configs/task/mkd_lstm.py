"""MKD-LSTM (thesis chapter 4): one bi-attentive LSTM student distilled from several tasks at once.

  python -m minilm_jax.distill_task --config configs/task/mkd_lstm.py --workdir <dir> \
      --config.teacher=<fine-tuning run of each task, comma separated>

Section 4.3.2's settings (`mkd_config`): BiLSTM 256 units, task layers 512, Adam lr 5e-4, batch 128,
16 epochs, gradient norm clipped to 1, masking-only augmentation.
"""

from minilm_jax.task_distill.config import mkd_config


def get_config():
  return mkd_config()
