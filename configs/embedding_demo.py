"""Sentence-embedding students of the real all-MiniLM-L6-v2 (6x384, mean-pooled, normalised) on
2 CPU cores in minutes, and the baselines they are measured against (docs/embeddings.md):

  python -m minilm_jax.train --config configs/embedding_demo.py --workdir workdirs/embedding
  python -m minilm_jax.train --config configs/embedding_demo.py:minilm --workdir workdirs/embedding_minilm
  python -m minilm_jax.train --config configs/embedding_demo.py:first_layers --workdir workdirs/first_layers
  python -m minilm_jax.train --config configs/embedding_demo.py:random --workdir workdirs/random_3x384

- embedding (the default): 3x384 taken from the teacher's layers 2, 4, 6 (ETD at the teacher's
  width keeps whole layers), then the MiniLM relations plus the embedding MSE against the
  teacher's normalised mean-pooled embeddings, so that every layer trains.
- minilm: the same start and budget, the MiniLM relations alone.
- first_layers: the teacher's first 3 layers, untrained further (what layer dropping gives).
- random: a random 3x384, untrained.

Short blocks (64 tokens) from the demo corpus: sentence-length inputs, 4 times the demo's batch.
"""

from minilm_jax.distill.config import base_config, demo_teacher

VARIANTS = ("embedding", "minilm", "first_layers", "random")


def get_config(variant="embedding"):
  if variant not in VARIANTS:
    raise ValueError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}")
  c = base_config()
  c.teacher.path = demo_teacher()
  c.student.num_layers = 3
  c.student.init = "random" if variant == "random" else "etd"
  c.etd.layers = "bottom" if variant == "first_layers" else "uniform"
  c.loss.embedding_weight = 1.0 if variant == "embedding" else 0.0
  c.data.corpus = "demo"
  c.data.max_seq_length = 64
  c.batch_size = 64
  c.num_steps = 0 if variant in ("first_layers", "random") else 300
  c.dtype = "float32"
  c.optimizer.lr = 1e-4  # the student starts from the teacher's layers: a small step keeps what they know
  c.optimizer.warmup_steps = 30
  c.checkpoint.every = 100
  c.log_every = 20
  return c
