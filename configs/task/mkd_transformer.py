"""MKD-Transformer (thesis section 4.1.3): a 3-layer Transformer initialised from the first three
layers of an encoder, the [CLS] vectors of its layers averaged, distilled from several tasks at once.

  python -m minilm_jax.distill_task --config configs/task/mkd_transformer.py --workdir <dir> \
      --config.teacher=<fine-tuning run of each task, comma separated> [--config.student.init=<pre-trained encoder>]

The start (`student.init`, a Hugging Face directory, hub id or run): by default the first teacher's
encoder. The thesis starts from pre-trained BERT-base's first three layers under its BERT-large
teachers; with a teacher of another width than BERT-base, that is the start to pass:
`--config.student.init=bert-base-uncased` (online; offline, a local copy of it). The student then
has the start's width, layers and WordPiece vocabulary (its tokenizer), whatever the teacher's.
Otherwise section 4.3.2's settings, as MKD-LSTM.
"""

from minilm_jax.task_distill.config import mkd_config


def get_config():
  c = mkd_config()
  c.student.kind = "transformer"
  c.student.num_layers = 3
  return c
