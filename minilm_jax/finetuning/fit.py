"""Epoch-based training (fine-tuning, multi-task refining, task distillation): the common
training loop with an evaluation after every epoch and the run's `results.json`."""

import json
import math
import os
from typing import Any, Protocol

import jax
from tqdm import tqdm

from minilm_jax import runs
from minilm_jax.devices.distributed import host_scalars
from minilm_jax.runs import lock
from minilm_jax.training.loop import LoopHooks, LoopRun, train_loop


class EpochRun(LoopRun, Protocol):
  """What `fit` trains: a run built and validated by its builder (`build_finetuning`,
  `build_multitask_finetuning`, `build_task_distillation`); besides what the loop reads
  (`LoopRun`: its config's `log_every` and `seed`, its stream with `batches_per_epoch`):"""

  # Read-only (the runs are frozen dataclasses): properties, so that a frozen field satisfies them.
  @property
  def tokenizer(self) -> Any:
    """Saved beside the checkpoints."""

  @property
  def selection_metric(self) -> str | None:
    """The metric that picks results.json's best epoch; None: no best."""

  def initial_state(self) -> tuple:
    """(train state, index of the next batch): restored or fresh (`train_state.restore_or_init`)."""

  def evaluate(self, params) -> dict:
    """Flat metrics of the evaluation splits: {"dev/accuracy": ...}."""


def fit(run: EpochRun, step_fn, summary: dict, desc: str, evaluate=None):
  """The `run()` of a fine-tuning or multi-task run: saves its tokenizer, starts from
  `run.initial_state()` (fresh or resumed), trains with `step_fn(state, local_batch, rng)`, evaluates
  `run.evaluate(params)` after every epoch (and on a run resumed after its last step), and writes
  the last metrics to `results.json` after `summary`, with every epoch's metrics and, where `run`
  has a `selection_metric`, the best epoch by it. `evaluate(step, state) -> metrics`: the run's
  evaluators (`train_loop`'s). Returns (state, metrics).
  `step_fn` takes the batch already placed on `run.mesh`."""
  state, next_batch = run.initial_state()
  if jax.process_index() == 0:
    runs.save_tokenizer(run.workdir, run.tokenizer)
  rng = jax.random.key(run.config.seed + 1)
  per_epoch, results = run.stream.batches_per_epoch, dict[str, float]()

  def after_step(done, state):
    if done % per_epoch and done != run.num_steps:
      return {}
    results.clear()
    results.update(run.evaluate(state.params))
    tqdm.write("  ".join(f"{k}={v:.4f}" for k, v in results.items()))
    return results

  hooks = LoopHooks(desc, after_step, evaluate)
  state = train_loop(run, state, next_batch, lambda state, batch: step_fn(state, batch, rng), hooks)
  if not results:  # resumed after the last step: evaluate what was saved
    results.update(run.evaluate(state.params))
  if jax.process_index() == 0:
    write_results(run, summary, int(host_scalars(state.step)), results)
  lock.release(run.workdir)  # its last write done: the workdir is free for the next program
  return state, results


def write_results(run: EpochRun, summary: dict, step: int, results: dict):
  """`results.json` in the run's workdir: its `summary`, its step and last evaluation `results`,
  every epoch's metrics and, with a `selection_metric`, the best epoch by it."""
  workdir, selection_metric = run.workdir, run.selection_metric
  epochs = _epoch_results(workdir, set(results), run.stream.batches_per_epoch)
  best = {}
  if selection_metric and epochs:
    best_row = max(epochs, key=lambda row: row[selection_metric])
    best = {"best_epoch": best_row["epoch"], "best": {selection_metric: best_row[selection_metric]}}
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump({**summary, "step": step, **results, "epochs": epochs, **best}, f, indent=2)


def _epoch_results(workdir: str, keys: set, per_epoch: int) -> list:
  """Every evaluation of a run, from its `metrics.jsonl` (which a resumed run keeps up to its
  checkpoint): [{"epoch", "step", metric: value, ...}] in step order."""
  rows = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if keys and keys <= set(row):
        rows[row["step"]] = {k: row[k] for k in sorted(keys)}
  return [{"epoch": math.ceil(step / per_epoch), "step": step, **rows[step]} for step in sorted(rows)]
