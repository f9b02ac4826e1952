"""Downstream tasks, by name: their data, features, losses, predictions and metrics.

`TASKS` is the registry: each task module contributes its own `TASKS` entries (GLUE and XNLI in
`glue`, SQuAD and MLQA in `squad`, the WordNet tasks in `wordnet`, sentence sentiment in `vader`,
the sequence-to-sequence tasks in `seq2seq`); `custom` builds a task from a config's `data.*`
fields. What they share: the inputs a sentence(-pair) task's model reads and the tasks and data
folders of a config's comma lists (`inputs`), the metrics (`metrics`; BLEU, ROUGE and METEOR in
`generation_metrics`). A new task of an existing kind is one entry in its module's `TASKS`.
"""

from minilm_jax.errors import UserError
from minilm_jax.tasks import custom, glue, seq2seq, squad, vader, wordnet

TASKS = {**glue.TASKS, **squad.TASKS, **wordnet.TASKS, **vader.TASKS, **seq2seq.TASKS}


def get_task(name: str, config=None):
  """A named task, or (`custom`) the one a fine-tuning config's `data` fields define."""
  if name == "custom":
    if config is None or "data" not in config:
      raise UserError(
        "task custom is defined by a fine-tuning config's data.* fields: fine-tune it on its own "
        "(python -m minilm_jax.finetune --config.task=custom --config.data.train=...)"
      )
    return custom.custom_task(config.data)
  if name not in TASKS:
    raise UserError(f"unknown task {name!r}: choose one of {', '.join(sorted(TASKS))}, or custom (your own files)")
  return TASKS[name]


def selection_metric(task) -> str:
  """The metric that picks a run's best epoch and the grid's best setting: the task's first metric
  on its first dev split."""
  return f"{task.eval_splits[0]}/{task.metrics[0]}"
