"""DeBERTa-v3-base -> a 6x384 DeBERTa student by MiniLMv2's relations (Q-Q, K-K, V-V over 48 relation
heads at the teacher's last layer), the paper's MiniLMv2 recipe with DeBERTa-v3 as the teacher:

  python -m minilm_jax.train --config configs/deberta_v3_6x384.py --workdir workdirs/deberta_v3_6x384

The student is of the teacher's architecture (disentangled attention over log-bucketed relative
positions, its tokenizer's 128,100 pieces), started at random as MiniLMv2's students are; its
relations read the teacher's content queries, keys and values (docs/fidelity.md, row 12). A
BERT-shaped student on the same vocabulary: --config.student.model_type=bert.
"""

from minilm_jax.distill.config import paper_config


def get_config():
  c = paper_config("microsoft/deberta-v3-base", 6, 384, batch_size=256, lr=3e-4)
  c.student.model_type, c.student.vocab_size = "deberta-v2", 128100
  c.loss.relations = "minilmv2"
  c.loss.num_relation_heads = 48
  return c
