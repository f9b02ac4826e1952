"""A hyper-parameter grid as one batch job: every (learning rate, epochs) pair is a fine-tuning run in
its own sub-workdir; the results table (Markdown and CSV) marks the best setting by the task's main metric."""

import copy
import csv
import os

import jax

from minilm_jax.errors import UserError
from minilm_jax.tasks.finetuning import FineTuning, get_task


def run_grid(config, workdir: str):
  if not workdir:
    raise UserError("--workdir is required: the grid's runs and tables go there")
  rows = []
  for lr in config.grid.lrs:
    for epochs in config.grid.epochs:
      setting = copy.deepcopy(config)
      setting.optimizer.lr, setting.epochs = lr, epochs
      run_dir = os.path.join(workdir, f"lr{lr:g}_epochs{epochs}")
      # Each run resumes or reuses its own checkpoints, so an interrupted grid continues where it stopped.
      _, results = FineTuning(setting, run_dir).run()
      rows.append({"lr": lr, "epochs": epochs, "workdir": run_dir, **results})
  main_metric = _main_metric(config)
  best = max(range(len(rows)), key=lambda i: rows[i][main_metric])
  if jax.process_index() == 0:
    write_tables(rows, best, main_metric, workdir)
  return rows, best


def _main_metric(config) -> str:
  task = get_task(config.task, config)
  return f"{task.eval_splits[0]}/{task.metrics[0]}"


def write_tables(rows, best: int, main_metric: str, workdir: str):
  columns = ["lr", "epochs"] + [k for k in rows[0] if "/" in k] + ["workdir"]
  with open(os.path.join(workdir, "grid.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, columns + ["best"], extrasaction="ignore")
    writer.writeheader()
    for i, row in enumerate(rows):
      writer.writerow({**row, "best": int(i == best)})
  cell = lambda c, v: f"{v:g}" if c == "lr" else f"{v:.4f}" if isinstance(v, float) else str(v)
  lines = [f"The best setting by `{main_metric}` is marked in the last column.", "", "| " + " | ".join(columns + ["best"]) + " |",
           "|" + " --- |" * (len(columns) + 1)]
  for i, row in enumerate(rows):
    lines.append("| " + " | ".join(cell(c, row[c]) for c in columns) + f" | {'**best**' if i == best else ''} |")
  with open(os.path.join(workdir, "grid.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
