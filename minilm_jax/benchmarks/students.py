"""`students` suite: which student is worth fine-tuning, at one distillation budget.

Every model is fine-tuned the same way on one task (default `wordnet_supersense`, offline) and
scored on its dev set: the teacher itself, what a user gets without distillation (the teacher's
first or evenly spaced layers, a random student of the same shape), and MiniLM students distilled
for the same number of tokens with each recipe worth comparing:

- `minilm_random`: the MiniLM relations (Q-K attention, V-V) of the last layers, random init;
- `minilm_etd`: the same from the teacher's evenly spaced layers (ETD at the teacher's width keeps
  whole layers; ETD-Rand picks neurons when narrower);
- `minilm_etd_embedding`: plus the sentence-embedding MSE, which trains the last layer's block;
- `minilmv2_etd`: MiniLMv2's Q-Q, K-K, V-V relations with 48 relation heads from the teacher's
  second-to-last layer (its upper-middle layer for a 6-layer teacher);
- `hidden_mse_etd`: attention KL plus the last layer's hidden states (MSE).
"""

import json
import logging
import os
import tempfile
from typing import Any

from minilm_jax import runs
from minilm_jax.distill.config import base_config as distill_config
from minilm_jax.distill.config import demo_teacher
from minilm_jax.distill.trainer import Distillation
from minilm_jax.errors import UserError
from minilm_jax.finetuning.config import base_config as finetune_config
from minilm_jax.finetuning.run import FineTuning
from minilm_jax.tasks import get_task, selection_metric

BASELINES = ("teacher", "first_layers", "uniform_layers", "random")
RECIPES: dict[str, dict[str, Any]] = {
  "minilm_random": {"init": "random", "lr": 1e-3},
  "minilm_etd": {"init": "etd"},
  "minilm_etd_embedding": {"init": "etd", "embedding_weight": 1.0},
  "minilmv2_etd": {"init": "etd", "relations": "minilmv2", "relation_heads": 48, "teacher_layer": -2},
  "hidden_mse_etd": {"init": "etd", "objective": "hidden_mse"},
}


def _student(
  name: str,
  teacher: str,
  teacher_config,
  shape: tuple,
  steps: int,
  batch: int,
  length: int,
  corpus: str,
  relation_heads: int,
):
  """The distillation config of a recipe or of a no-distillation baseline (0 steps)."""
  recipe = RECIPES.get(name, {})
  c = distill_config()
  c.teacher.path, c.data.corpus, c.dtype = teacher, corpus, "float32"
  c.student.num_layers, c.student.hidden_size = shape
  # The teacher's heads and feed-forward ratio: ETD keeps every head and narrows each block alike.
  c.student.num_heads = teacher_config.num_heads
  c.student.intermediate_size = shape[1] * teacher_config.intermediate_size // teacher_config.hidden_size
  c.student.init = "random" if name in ("random", "minilm_random") else "etd"
  c.etd.layers = "bottom" if name == "first_layers" else "uniform"
  c.teacher.layer = recipe.get("teacher_layer", -1)
  c.loss.objective = recipe.get("objective", "minilm")
  c.loss.relations = recipe.get("relations", "minilm")
  c.loss.num_relation_heads = recipe.get("relation_heads", relation_heads)
  c.loss.embedding_weight = recipe.get("embedding_weight", 0.0)
  c.data.max_seq_length, c.batch_size = length, batch
  c.num_steps = steps if name in RECIPES else 0
  c.optimizer.lr = recipe.get("lr", 1e-4)
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.checkpoint.every, c.log_every = 10**9, max(1, steps // 10)
  return c


def _finetune(init: str, task: str, data_dir: str, epochs: int, length: int, lr: float, mesh, workdir: str) -> float:
  c = finetune_config()
  c.task, c.init, c.data_dir, c.epochs, c.max_seq_length = task, init, data_dir, epochs, length
  c.optimizer.lr, c.checkpoint.every = lr, 10**9
  # The host reads the metrics every 20 steps, which also bounds how many steps are queued ahead on
  # the devices (XLA's CPU collectives can stall with hundreds queued on 8 fake devices).
  c.log_every = 20
  _, results = FineTuning(c, workdir, mesh).run()
  return results[selection_metric(get_task(task))]


def run(
  teacher: str = "",
  student: str = "3x384",
  steps: int = 300,
  batch: int = 64,
  length: int = 64,
  task: str = "wordnet_supersense",
  data_dir: str = "",
  finetune_epochs: int = 3,
  finetune_lr: float = 1e-4,
  corpus: str = "demo",
  relation_heads: int = 12,
  models=BASELINES + tuple(RECIPES),
  mesh=None,
) -> list:
  """One row per model: its dev score after fine-tuning and the tokens it was distilled on."""
  teacher = teacher or demo_teacher()
  try:
    shape = tuple(int(n) for n in student.split("x"))
  except ValueError:
    raise UserError(f"--student {student}: give layers x width, e.g. 3x384") from None
  unknown = [m for m in models if m not in BASELINES and m not in RECIPES]
  if unknown:
    raise UserError(f"unknown students {unknown}: choose from {', '.join(BASELINES + tuple(RECIPES))}")
  metric = selection_metric(get_task(task))
  teacher_config = runs.encoder_config_of(teacher, what="--teacher")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in models:
      init = teacher
      if name != "teacher":
        init = os.path.join(tmp, name)
        Distillation(
          _student(name, teacher, teacher_config, shape, steps, batch, length, corpus, relation_heads), init, mesh
        ).run()
      score = _finetune(
        init, task, data_dir, finetune_epochs, length, finetune_lr, mesh, os.path.join(tmp, f"{name}_ft")
      )
      tokens = steps * batch * length if name in RECIPES else 0
      rows.append(
        {
          "model": name,
          "student": "teacher" if name == "teacher" else student,
          "distill_tokens": tokens,
          metric: round(score, 4),
        }
      )
      logging.warning("bench students: %s", json.dumps(rows[-1]))  # each row as it is done: the suite is long
  return rows
