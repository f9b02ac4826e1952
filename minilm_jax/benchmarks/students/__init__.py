"""The `students` suite (`bench students`): which student is worth fine-tuning, over several tasks
and seeds. `settings` (what a run measures and how), `suite` (the models' distillation and
fine-tuning, the rows), `recipes` (the models: the
distillation recipes, the two-stage rows, the ensembles), `tasks` (the tasks it fine-tunes on and
their data), `scores` (a model's scores, the errors of differences, the ranks),
`log` (the measurements kept by what determines them, so that a suite of hours resumes)."""

from minilm_jax.benchmarks.students.recipes import RECIPES
from minilm_jax.benchmarks.students.scores import BASELINES
from minilm_jax.benchmarks.students.settings import DEFAULT_TASKS, Settings
from minilm_jax.benchmarks.students.suite import run

__all__ = ["BASELINES", "DEFAULT_TASKS", "RECIPES", "Settings", "run"]
