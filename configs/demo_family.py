"""The demo's recipe for three students of all-MiniLM-L6-v2 at once (`distill.family`): 2x384, 3x384
and 3x192, each started from the teacher's evenly spaced layers (3x192 from their neurons too, ETD
at half the width) and taught its sentence embeddings (3x192 through a learnt map to the teacher's
width), the teacher's pass over each batch computed once for the three. On a CPU in minutes;
each student's evaluators are logged under its name (`3x384/eval/wordnet/recall@10`). Export one:
`python -m minilm_jax.convert --to-hf --workdir <workdir> --student 3x384 --out <dir>`."""

import importlib.util
import os


def _demo_config():
  """configs/demo.py's config: the family's teacher, corpus, budget and evaluators."""
  spec = importlib.util.spec_from_file_location("demo", os.path.join(os.path.dirname(__file__), "demo.py"))
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def get_config():
  c = _demo_config()
  c.checkpoint.best = ""  # a family keeps its latest checkpoints: one best step is one student's
  c.family = (
    dict(name="2x384", student=dict(num_layers=2)),
    dict(name="3x384"),
    dict(name="3x192", student=dict(hidden_size=192, intermediate_size=768)),
  )
  return c
