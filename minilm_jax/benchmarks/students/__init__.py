"""The `students` suite (`bench students`): which student is worth fine-tuning, over several tasks
and seeds. `suite` (the models, their distillation and fine-tuning, the rows), `tasks` (the tasks it
fine-tunes on and their data), `scores` (a model's scores, the errors of differences, the ranks),
`log` (the measurements kept by what determines them, so that a suite of hours resumes)."""

from minilm_jax.benchmarks.students.suite import BASELINES, DEFAULT_TASKS, RECIPES, run

__all__ = ["BASELINES", "DEFAULT_TASKS", "RECIPES", "run"]
