"""Batch evaluation: many fine-tuned runs (and checkpoints) x their tasks in one job.

Runs: fine-tuning runs (one task), and multi-task runs (the refined teacher, and the task-distilled
LSTM and Transformer students, one head per task). Per run, step and task: metrics of every labelled
split, predictions, and for GLUE tasks whose data folder holds test files, submission files in the
GLUE server's format (the thesis's tables are test-server numbers). Checkpoints are restored straight
onto this job's own mesh.
"""

import dataclasses
import json
import os
from functools import partial

import jax
import ml_collections
from tqdm import tqdm

from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.predictor import Predictor, prediction_forward
from minilm_jax.models import sharding
from minilm_jax.models.heads import task_model
from minilm_jax.runs.reading import read_multitask_run
from minilm_jax.tasks import get_task
from minilm_jax.tasks.inputs import model_inputs, task_data_dirs, task_features


def write_predictions(task, predictions, examples, path: str):
  """`path`.json (id -> answer or generated text: SQuAD's official prediction format) or `path`.tsv
  (index and label name or score, as GLUE's submission files)."""
  if isinstance(predictions, dict):
    with open(path + ".json", "w") as f:
      json.dump(predictions, f, indent=1)
    return
  with open(path + ".tsv", "w") as f:
    f.write("index\tprediction\n")
    for idx, p in zip(examples["idx"], predictions):
      f.write(f"{idx}\t{p if task.labels is None else task.labels[int(p)]}\n")


@dataclasses.dataclass(frozen=True)
class _Run:
  """A run to evaluate: its workdir, its config (with the job's `data_dir` when given), whether it
  is a multi-task run."""

  workdir: str
  config: ml_collections.ConfigDict
  multi_task: bool


def _run_config(workdir: str, data_dir: str) -> _Run:
  record = runs.read_record(workdir)
  if not record.tasks:
    raise UserError(
      f"{workdir} is not a fine-tuning or task-distillation run (its checkpoints have no task): fine-tune it first"
    )
  config = ml_collections.ConfigDict(record.config)
  if data_dir:
    config.data_dir = data_dir
  return _Run(workdir, config, record.multi_task)


@dataclasses.dataclass
class _TaskEvaluation:
  """One task of a run: its compiled forward and its splits' (features, examples)."""

  task: object
  predict: Predictor
  data: dict
  prefix: str  # before the predictions' file names: the task's name in a multi-task run


def _splits(task, data_dir: str) -> list:
  """The labelled splits, plus the unlabelled test splits whose files are in `data_dir`."""
  tests = [s for s in task.test_splits if data_dir and os.path.isfile(os.path.join(data_dir, f"{s}.tsv"))]
  return list(task.eval_splits) + tests


def _read_checkpoint(run: _Run, step: int, mesh, batch_size: int, prepare: bool):
  """(params of the checkpoint, and when `prepare` the run's `_TaskEvaluation`s). A fine-tuning run
  has one task; a multi-task run (refined teacher, or LSTM/Transformer student) one per head."""
  workdir, config = run.workdir, run.config
  if run.multi_task:
    model, params, tokenizer, tasks, joint = read_multitask_run(workdir, mesh, step)
    if not prepare:
      return params, None
    shardings, dirs = sharding.tree_shardings(params, mesh), task_data_dirs(tasks, config.data_dir)

    def features(task, split: str):
      examples = task.load(split, dirs[task.name], "")
      return task_features(joint, task, examples, tokenizer, config.max_seq_length), examples

    evaluations = []
    for task in tasks:
      forward = partial(_apply_task, model, task.name)
      data = {s: features(task, s) for s in _splits(task, dirs[task.name])}
      evaluations.append(
        _TaskEvaluation(
          task, Predictor(forward, mesh, shardings, batch_size, model_inputs(joint, task)), data, f"{task.name}_"
        )
      )
    return params, evaluations
  encoder_config, params, tokenizer, head = runs.read_run(workdir, step, mesh=mesh, tokenizer=prepare)[:4]
  if not prepare:
    return params, None
  assert head is not None  # a single-task run with tasks (`_run_config`) is a fine-tuning run, with its head
  task = get_task(config.task, config)
  forward = prediction_forward(task, task_model(encoder_config, head), config, tokenizer)
  predict = Predictor(forward, mesh, sharding.tree_shardings(params, mesh), batch_size)
  data = {s: task.prepare(s, config, tokenizer) for s in _splits(task, config.data_dir)}
  return params, [_TaskEvaluation(task, predict, data, "")]


def _apply_task(model, task_name, params, batch):
  return model.apply({"params": params}, batch, task_name)


def evaluate_runs(
  workdirs, out_dir: str | None, all_steps: bool = False, data_dir: str = "", batch_size: int = 128, mesh=None
):
  """Evaluates every run (all its checkpoints, or the latest); returns the metric rows and writes
  `metrics.json`, predictions and submission files under `out_dir` (None: writes nothing, the
  other processes of a multi-process evaluation)."""
  mesh = mesh or parallel.make_mesh()
  jobs, configs = [], {}
  for workdir in workdirs:  # every run checked before any is evaluated
    if not runs.is_run(workdir):
      raise UserError(
        f"{workdir} is not a run's workdir (no checkpoints/): pass fine-tuning or task-distillation workdirs"
      )
    configs[workdir] = _run_config(workdir, data_dir)
    ckpt = runs.RunCheckpoints(workdir, read_only=True)
    steps = list(ckpt.manager.all_steps()) if all_steps else [ckpt.latest_step()]
    ckpt.close()
    jobs += [(workdir, step) for step in steps]
  rows, prepared = list[dict](), dict[str, list]()
  for workdir, step in tqdm(jobs, desc="evaluate", unit="checkpoint", disable=jax.process_index() != 0):
    # Once per run, whatever its number of checkpoints: data and compiled forwards.
    config = configs[workdir].config
    params, evaluations = _read_checkpoint(configs[workdir], step, mesh, batch_size, workdir not in prepared)
    evaluations = prepared.setdefault(workdir, evaluations)
    target = out_dir and os.path.join(out_dir, os.path.basename(os.path.normpath(workdir)), f"step_{step}")
    if target:
      os.makedirs(target, exist_ok=True)
    for e in evaluations:
      task = e.task
      for split, (features, examples) in e.data.items():
        outputs = e.predict(params, features, desc=f"{e.prefix}{split}")
        if split in task.eval_splits:
          scores, predictions = task.evaluate(outputs, features, examples, config)
          rows.append({"run": workdir, "task": task.name, "step": step, "split": split, **scores})
          if target:
            write_predictions(task, predictions, examples, os.path.join(target, f"{e.prefix}{split}_predictions"))
        elif target:
          name = task.submission_names[task.test_splits.index(split)]
          task.write_submission(task.predict(outputs), examples, os.path.join(target, f"{name}.tsv"))
  if out_dir:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
      json.dump(rows, f, indent=2)
  return rows
