"""A hyper-parameter grid as one batch job: every (learning rate, epochs) pair is `seeds` fine-tuning
runs (seeds `seed`, `seed + 1`, ...), each in its own sub-workdir; the results table (Markdown and
CSV) gives every metric's mean and standard deviation over the seeds (the papers report the mean of
several runs) and marks the best setting by the mean of the task's main metric."""

import copy
import csv
import os

import jax
import numpy as np

from minilm_jax.errors import UserError
from minilm_jax.finetuning.config import RANGES
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.tasks import get_task, selection_metric
from minilm_jax.training.loop import check_fields


def run_grid(config, workdir: str, settings=None):
  """`settings`: the (lr, epochs) pairs; default every pair of `config.grid`."""
  if not workdir:
    raise UserError("--workdir is required: the grid's runs and tables go there")
  check_fields(config, RANGES)  # before the first run: `seeds` is the grid's, the runs record seeds=1
  settings = settings or [(lr, epochs) for lr in config.grid.lrs for epochs in config.grid.epochs]
  rows = []
  for lr, epochs in settings:
    name = f"lr{lr:g}_epochs{epochs}"
    per_seed = []
    for k in range(config.seeds):
      run = copy.deepcopy(config)
      # Each run is one seed; its recorded config says so, so adding seeds later reuses the runs made.
      run.optimizer.lr, run.epochs, run.seed, run.seeds = lr, epochs, config.seed + k, 1
      if config.distill.teacher:  # the runs share one cache (keyed by content): augmented and labelled once
        run.distill.cache_dir = config.distill.cache_dir or os.path.join(workdir, "cache")
      run_dir = os.path.join(workdir, name if config.seeds == 1 else os.path.join(name, f"seed{config.seed + k}"))
      # Each run resumes or reuses its own checkpoints, so an interrupted grid continues where it stopped.
      per_seed.append(build_finetuning(run, run_dir).run()[1])
    rows.append(
      {
        "lr": lr,
        "epochs": epochs,
        "seeds": config.seeds,
        "workdir": os.path.join(workdir, name),
        **_mean_and_std(per_seed),
      }
    )
  main_metric = selection_metric(get_task(config.task, config))
  best = max(range(len(rows)), key=lambda i: rows[i][main_metric])
  if jax.process_index() == 0:
    write_tables(rows, best, main_metric, workdir)
  return rows, best


def _mean_and_std(results: list) -> dict:
  """{metric: mean over the runs, metric_std: their sample standard deviation (0 for one run)}."""
  out = {}
  for key in results[0]:
    values = np.asarray([r[key] for r in results], np.float64)
    out[key] = float(values.mean())
    out[f"{key}_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
  return out


def write_tables(rows, best: int, main_metric: str, workdir: str):
  columns = ["lr", "epochs", "seeds"] + [k for k in rows[0] if "/" in k] + ["workdir"]
  with open(os.path.join(workdir, "grid.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, columns + ["best"], extrasaction="ignore")
    writer.writeheader()
    for i, row in enumerate(rows):
      writer.writerow({**row, "best": int(i == best)})
  cell = lambda c, v: f"{v:g}" if c == "lr" else f"{v:.4f}" if isinstance(v, float) else str(v)
  lines = [
    f"The best setting by the mean of `{main_metric}` over {rows[0]['seeds']} seed(s) is marked in the last "
    f"column; `_std`: the standard deviation over the seeds.",
    "",
    "| " + " | ".join(columns + ["best"]) + " |",
    "|" + " --- |" * (len(columns) + 1),
  ]
  for i, row in enumerate(rows):
    lines.append("| " + " | ".join(cell(c, row[c]) for c in columns) + f" | {'**best**' if i == best else ''} |")
  with open(os.path.join(workdir, "grid.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
