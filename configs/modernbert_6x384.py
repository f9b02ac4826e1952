"""ModernBERT-base -> a 6x384 ModernBERT student at its full context, 8 x 8,192 tokens a step, by
MiniLMv2's relations (Q-Q, K-K, V-V over 48 relation heads at the teacher's last layer, a global one):

  python -m minilm_jax.train --config configs/modernbert_6x384.py --workdir workdirs/modernbert_6x384

The student is of the teacher's architecture (rotary positions; layers 0 and 3 global, the others
within the 128-token window; GeGLU at the teacher's 1.5 x width), started at random as MiniLMv2's
students are, without dropout as ModernBERT trains; its relations read the teacher's queries and
keys after the rotation (docs/fidelity.md, row 12). What it compiles to on one H100 is in
docs/compiling.md.
"""

from minilm_jax.distill.config import paper_config


def get_config():
  c = paper_config("answerdotai/ModernBERT-base", 6, 384, batch_size=8, lr=3e-4)
  c.student.model_type, c.student.vocab_size = "modernbert", 50368
  c.student.intermediate_size = 576
  c.student.dropout = 0.0
  c.loss.relations = "minilmv2"
  c.loss.num_relation_heads = 48
  c.data.max_seq_length = 8192
  return c
