"""all-mpnet-base-v2 -> a 6x384 MPNet sentence-embedding student: MiniLM's relations at the last
layers plus the embedding term (the teacher's mean-pooled, normalised sentence embeddings, through a
learnt map to its width), from the teacher's evenly spaced layers, narrowed by ETD:

  python -m minilm_jax.train --config configs/mpnet_6x384.py --workdir workdirs/mpnet_6x384
  python -m minilm_jax.convert --to-hf --sentence-transformers --workdir workdirs/mpnet_6x384 --out mpnet_6x384

The student keeps MPNet's relative-position table (one for its layers, as the teacher's).
"""

from minilm_jax.distill.config import paper_config


def get_config():
  c = paper_config("sentence-transformers/all-mpnet-base-v2", 6, 384, batch_size=256, lr=3e-4)
  c.student.model_type, c.student.vocab_size = "mpnet", 30527
  c.student.init, c.etd.method = "etd", "rand"
  c.loss.embedding_weight = 1.0
  c.data.max_seq_length = 128  # sentence-length inputs, as the teacher's own training
  return c
