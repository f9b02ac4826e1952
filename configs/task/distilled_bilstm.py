"""Distilled BiLSTM (thesis chapter 3): one task's fine-tuned teacher into a single-layer BiLSTM.

  python -m minilm_jax.distill_task --config configs/task/distilled_bilstm.py --workdir <dir> \
      --config.tasks=wordnet_supersense --config.teacher=<fine-tuning run of that task>

Logit MSE on the training set augmented 10x (masking and POS-guided replacement, p = 0.1 each);
AdaDelta (lr 1.0, rho 0.95), batch 50; BiLSTM 150 units, Dense+ReLU 200. Sentence-pair tasks: the
same BiLSTM, siamese (both sentences through it, `[h1, h2, h1*h2, |h1-h2|]`). Small tasks (STS-B,
MRPC): `--config.augment.size_factor=40 --config.augment.n_iter=78`. Ablations:
`--config.objective=soft_ce --config.temperature=...`, `--config.objective=hard` (gold labels, no
augmentation). The thesis's word2vec start (section
3.4.1, multichannel): `--config.student.word_vectors=GoogleNews-vectors-negative300.bin` (a local file).
"""

from minilm_jax.task_distill.config import task_distillation_config


def get_config():
  c = task_distillation_config()
  c.tasks = "wordnet_supersense"
  return c
