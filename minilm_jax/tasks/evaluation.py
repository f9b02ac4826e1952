"""Batch evaluation: many fine-tuned runs (and checkpoints) x their tasks in one job.

Per run and step: metrics of every dev split, predictions, and for GLUE tasks whose data folder
holds test files, submission files in the GLUE server's format. Checkpoints are restored straight
onto this job's own mesh.
"""

import json
import os

import jax
import ml_collections
from tqdm import tqdm

from minilm_jax import checkpoint, parallel, runs
from minilm_jax.errors import UserError
from minilm_jax.models.heads import task_model
from minilm_jax.tasks.finetuning import Predictor, get_task, task_forward


def _run_config(workdir: str, data_dir: str) -> ml_collections.ConfigDict:
  meta = runs.read_meta(workdir)
  if "tasks" in meta:
    raise UserError(f"{workdir} is a multi-task run ({meta.get('model')}): batch evaluation takes single-task "
                    f"fine-tuning runs; its dev metrics per task are in its results.json")
  if "task" not in meta:
    raise UserError(f"{workdir} is not a fine-tuning run (its checkpoints have no task): fine-tune it first")
  config = ml_collections.ConfigDict(meta["config"])
  if data_dir:
    config.data_dir = data_dir
  return config


def _write_predictions(task, predictions, examples, path: str):
  if isinstance(predictions, dict):  # SQuAD: id -> answer text, the official prediction-file format
    with open(path + ".json", "w") as f:
      json.dump(predictions, f, indent=1)
    return
  with open(path + ".tsv", "w") as f:
    f.write("index\tprediction\n")
    for idx, p in zip(examples["idx"], predictions):
      f.write(f"{idx}\t{p if task.labels is None else task.labels[int(p)]}\n")


def evaluate_runs(workdirs, out_dir: str, all_steps: bool = False, data_dir: str = "", batch_size: int = 128,
                  mesh=None):
  """Evaluates every run (all its checkpoints, or the latest); returns the metric rows and writes
  `metrics.json`, predictions and submission files under `out_dir`."""
  mesh = mesh or parallel.make_mesh()
  jobs, configs = [], {}
  for workdir in workdirs:  # every run checked before any is evaluated
    if not checkpoint.is_run(workdir):
      raise UserError(f"{workdir} is not a run's workdir (no checkpoints/): pass fine-tuning workdirs")
    configs[workdir] = _run_config(workdir, data_dir)
    ckpt = checkpoint.RunCheckpoints(workdir, read_only=True)
    steps = list(ckpt.manager.all_steps()) if all_steps else [ckpt.latest_step()]
    ckpt.close()
    jobs += [(workdir, step) for step in steps]
  rows, prepared = [], {}
  for workdir, step in tqdm(jobs, desc="evaluate", unit="checkpoint", disable=jax.process_index() != 0):
    encoder_config, head, params, tokenizer = runs.read_run(workdir, step, mesh=mesh)
    if workdir not in prepared:  # once per run, whatever its number of checkpoints: config, data, compiled forward
      config = configs[workdir]
      task = get_task(config.task, config)
      splits = list(task.eval_splits)
      if config.data_dir:
        splits += [s for s in task.test_splits if os.path.isfile(os.path.join(config.data_dir, f"{s}.tsv"))]
      predict = Predictor(task_forward(task_model(encoder_config, head)), mesh, parallel.tree_shardings(params, mesh), batch_size)
      prepared[workdir] = (config, task, predict, {s: task.prepare(s, config, tokenizer) for s in splits})
    config, task, predict, data = prepared[workdir]
    target = os.path.join(out_dir, os.path.basename(os.path.normpath(workdir)), f"step_{step}")
    os.makedirs(target, exist_ok=True)
    for split, (features, examples) in data.items():
      outputs = predict(params, features, desc=split)
      if split in task.eval_splits:
        scores, predictions = task.evaluate(outputs, features, examples, config)
        rows.append({"run": workdir, "task": task.name, "step": step, "split": split, **scores})
        _write_predictions(task, predictions, examples, os.path.join(target, f"{split}_predictions"))
      else:
        name = task.submission_names[task.test_splits.index(split)]
        task.write_submission(task.predict(outputs), examples, os.path.join(target, f"{name}.tsv"))
  if jax.process_index() == 0:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "metrics.json"), "w") as f:
      json.dump(rows, f, indent=2)
  return rows
