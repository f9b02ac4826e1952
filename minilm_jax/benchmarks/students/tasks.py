"""The `students` suite's tasks: `--tasks` entries read as tasks of the registry with their data
(a folder or file), or the user's own files (`custom=FOLDER`), checked before any distillation."""

import dataclasses
import functools
import glob
import os
from typing import Any

from minilm_jax.errors import UserError
from minilm_jax.finetuning.config import base_config as finetune_config
from minilm_jax.tasks import custom, get_task
from minilm_jax.tasks.glue import ClassificationTask


@dataclasses.dataclass(frozen=True)
class BenchTask:
  """One task of the suite: its name, its data (a folder or file; empty: the task's default) and,
  for `custom`, the fine-tuning config's `data` fields."""

  name: str
  data_dir: str = ""
  custom_data: Any = None

  @property
  def label(self) -> str:
    return os.path.basename(self.data_dir.rstrip("/")) if self.name == "custom" else self.name

  @functools.cached_property
  def task(self):
    """The task, built once: a custom task reads its training file for the class names."""
    return custom.custom_task(self.custom_data) if self.name == "custom" else get_task(self.name)


def parse_tasks(specs) -> list:
  """`--tasks` entries: a task's name, `name=DATA` (its folder or file), or `custom=FOLDER` (the
  user's `train` and `dev` files there, CSV, TSV, JSON Lines or Parquet, columns `text` and `label`)."""
  tasks = []
  for spec in specs:
    name, _, data_dir = spec.partition("=")
    if name == "custom":
      tasks.append(BenchTask(name, data_dir, _custom_data(data_dir)))
      continue
    bench_task = BenchTask(name, data_dir)
    task = bench_task.task
    if not isinstance(task, ClassificationTask):
      raise UserError(f"--tasks {name}: the suite fine-tunes classification and regression tasks")
    tasks.append(bench_task)
  for t in tasks:  # an unknown name or missing data is a one-line error now, not after the first distillation
    t.task.load("dev", t.data_dir)
  if not tasks:
    raise UserError(
      "--tasks names no task: e.g. --tasks wordnet_supersense,vader_movies=DIR/vaderSentiment-3.3.2.tar.gz"
    )
  return tasks


_SUFFIXES = ".csv, .tsv, .jsonl or .parquet"


def _custom_data(folder: str):
  if not os.path.isdir(folder):
    raise UserError(f"--tasks custom={folder}: give a folder holding train and dev files ({_SUFFIXES})")
  found = {}
  for split in ("train", "dev"):
    paths = sorted(glob.glob(os.path.join(folder, f"{split}.*")))
    if not paths:
      raise UserError(f"--tasks custom={folder}: the folder has no {split} file ({split} with {_SUFFIXES})")
    found[split] = paths[0]
  data = finetune_config().data
  data.train, data.dev = found["train"], found["dev"]
  return data
