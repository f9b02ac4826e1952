"""The `students` suite's models, each keyed by its name: the baselines (`scores.BASELINES`), the
distillation recipes and the distillation config of each, the two-stage rows and the ensembles.

The models: the teacher itself, what a user gets without distillation (the teacher's
first or evenly spaced layers, a random student of the same shape), and MiniLM students distilled
for the same number of tokens with each recipe worth comparing:

- `minilm_random`: the MiniLM relations (Q-K attention, V-V) of the last layers, random init;
- `minilm_etd`: the same from the teacher's evenly spaced layers (ETD at the teacher's width keeps
  whole layers; ETD-Rand picks neurons when narrower);
- `minilm_etd_embedding`: plus the sentence-embedding MSE, which trains the last layer's block;
- `minilmv2_etd`: MiniLMv2's Q-Q, K-K, V-V relations with 48 relation heads from the teacher's
  second-to-last layer (its upper-middle layer for a 6-layer teacher);
- `hidden_mse_etd`: attention KL plus the last layer's hidden states (MSE);
- `minilm_first_embedding`: the MiniLM relations and the embedding MSE from the teacher's first
  layers (the better start on some tasks after fine-tuning);
- `tinybert_layerwise_etd`: TinyBERT's layer-wise transfer from the evenly spaced layers: every
  student layer learns its teacher layer's attention and hidden states, the embeddings too;
- `embedding_first`: the teacher's first layers learning its sentence embeddings alone (MSE);
- `embedding_etd`: the same from the evenly spaced layers (the better start after fine-tuning on
  WordNet's definitions).

Two stages (TinyBERT's; the thesis's task distillation): a model of the suite, then fine-tuned by
distilling the teacher fine-tuned on each task (its seed-0 fine-tuning, kept) instead of learning the
gold labels, with the suite's optimiser and epochs over the task's training set augmented as the
thesis does (`finetuning/distillation.py`):

- `embedding_etd_lr5e4+task_kd`: the teacher's logits (MSE) and its layers (TinyBERT's embeddings,
  attention scores and hidden states at every layer of the uniform map) on the augmented set;
- `+task_kd_logits`: the logits alone; `+task_kd_no_augment`: on the training set alone;
- `uniform_layers+task_kd`: the same second stage on the undistilled evenly spaced layers;
- `embedding_etd_lr5e4+long`: the first stage fine-tuned on the gold labels for as many steps as
  its second stage takes (as many epochs as the augmented set is times the training set): what more
  steps alone give.
- `embedding_etd_lr5e4+task_kd_teachers3`: the second stage learning three teachers at once, the
  teacher fine-tuned with seeds 0, 1 and 2 (the teacher row's own runs, kept), their logits averaged
  and their layers' term from the first; `teacher_ensemble3`: what it learns, those three teachers'
  mean logits scored on the dev set; `+task_kd_teachers3_copies2x`: the same on twice the augmented
  copies.
"""

from typing import Any

from minilm_jax.benchmarks.students.settings import Settings
from minilm_jax.distill.config import base_config as distill_config

RECIPES: dict[str, dict[str, Any]] = {
  "minilm_random": {"init": "random", "lr": 1e-3},
  "minilm_etd": {"init": "etd"},
  "minilm_etd_embedding": {"init": "etd", "embedding_weight": 1.0},
  "minilmv2_etd": {"init": "etd", "relations": "minilmv2", "relation_heads": 48, "teacher_layer": -2},
  "hidden_mse_etd": {"init": "etd", "objective": "hidden_mse"},
  "minilm_first_embedding": {"init": "etd", "layers": "bottom", "embedding_weight": 1.0},
  "tinybert_layerwise_etd": {"init": "etd", "objective": "tinybert_layerwise"},
  "embedding_first": {"init": "etd", "layers": "bottom", "objective": "embedding"},
  "embedding_etd": {"init": "etd", "objective": "embedding"},
  # The embedding loss is still falling when 1e-4 has decayed: the same budget at five times the rate.
  "embedding_etd_lr5e4": {"init": "etd", "objective": "embedding", "lr": 5e-4},
  # The pooled embedding is one target a text; every layer's token states are one a token and layer.
  "hidden_embedding_etd_lr5e4": {
    "init": "etd",
    "objective": "hidden_states",
    "layer_map": "all",
    "embedding_weight": 1.0,
    "lr": 5e-4,
  },
}


def student_config(name: str, teacher_config, settings: Settings):
  """The distillation config of a recipe or of a no-distillation baseline (0 steps) of the student
  `settings` names, from its teacher (`teacher_config` its architecture), with its first stage's
  budget, corpus and relation heads."""
  recipe = RECIPES.get(name, {})
  shape, steps, corpus = settings.shape, settings.steps, settings.corpus
  batch, length, relation_heads = settings.batch, settings.length, settings.relation_heads
  # A baseline is not distilled, and ETD-Rand reads no text: its config (so its results' key) must
  # depend on neither the budget nor the corpus, or every new corpus would fine-tune it again.
  if name not in RECIPES:
    steps, corpus = 0, "demo"
  c = distill_config()
  c.teacher.path, c.data.corpus, c.dtype = settings.teacher, corpus, "float32"
  c.student.num_layers, c.student.hidden_size = shape
  c.student.model_type, c.student.vocab_size = teacher_config.model_type, teacher_config.vocab_size
  # The teacher's heads and feed-forward ratio: ETD keeps every head and narrows each block alike.
  c.student.num_heads = teacher_config.num_heads
  c.student.intermediate_size = shape[1] * teacher_config.intermediate_size // teacher_config.hidden_size
  c.student.init = "random" if name in ("random", "minilm_random") else "etd"
  c.etd.layers = recipe.get("layers", "bottom" if name == "first_layers" else "uniform")
  c.teacher.layer = recipe.get("teacher_layer", -1)
  c.loss.objective = recipe.get("objective", "minilm")
  c.loss.layer_map = recipe.get("layer_map", "last")
  c.loss.relations = recipe.get("relations", "minilm")
  c.loss.num_relation_heads = recipe.get("relation_heads", relation_heads)
  c.loss.embedding_weight = recipe.get("embedding_weight", 0.0)
  c.data.max_seq_length, c.batch_size = length, batch
  c.num_steps = steps
  c.optimizer.lr = recipe.get("lr", 1e-4)
  c.optimizer.warmup_steps = max(1, steps // 10)
  c.checkpoint.every, c.log_every = 10**9, max(1, steps // 10)
  return c


# Second stages: (the model of the suite they start from, distill.layers, augment.enabled), or that
# model fine-tuned on the gold labels for the steps of a second stage (`steps_of`).
TWO_STAGE: dict[str, dict[str, Any]] = {
  "embedding_etd_lr5e4+task_kd": {"first": "embedding_etd_lr5e4", "layers": "tinybert_layerwise", "augment": True},
  "embedding_etd_lr5e4+task_kd_logits": {"first": "embedding_etd_lr5e4", "layers": "", "augment": True},
  "embedding_etd_lr5e4+task_kd_no_augment": {
    "first": "embedding_etd_lr5e4",
    "layers": "tinybert_layerwise",
    "augment": False,
  },
  "uniform_layers+task_kd": {"first": "uniform_layers", "layers": "tinybert_layerwise", "augment": True},
  "embedding_etd_lr5e4+long": {"first": "embedding_etd_lr5e4", "steps_of": "embedding_etd_lr5e4+task_kd"},
  # The teacher's fine-tunings with seeds 0, 1 and 2 as one teacher: their logits averaged.
  "embedding_etd_lr5e4+task_kd_teachers3": {
    "first": "embedding_etd_lr5e4",
    "layers": "tinybert_layerwise",
    "augment": True,
    "teachers": 3,
  },
  # The lever on what the three teachers' student falls short of (docs/task_distillation.md): twice
  # the augmented copies (twice the draws an example, at most twice the set's size), so twice the
  # second stage's steps, each on new text rather than a repeated epoch.
  "embedding_etd_lr5e4+task_kd_teachers3_copies2x": {
    "first": "embedding_etd_lr5e4",
    "layers": "tinybert_layerwise",
    "augment": True,
    "teachers": 3,
    "copies": 2,
  },
}
# Rows that score the mean logits of the teacher's first fine-tunings (seeds 0 on): what the second
# stages with as many teachers learn.
ENSEMBLES = {"teacher_ensemble3": 3}
