"""Scalar metrics to a JSONL file and TensorBoard event files; only process 0 writes."""

import json
import os

import jax

from minilm_jax.data.files import written_whole


class MetricWriter:
  """Appends to a run's metrics. A run resumed at `start_step` first drops what an interrupted
  earlier attempt logged after that step (it will be logged again), from both files; a run that
  starts afresh (`start_step` -1: no checkpoint to resume) drops all of it, its step 0 included."""

  def __init__(self, workdir: str, start_step: int = 0):
    self.enabled = jax.process_index() == 0
    if self.enabled:
      from tensorboardX import SummaryWriter

      os.makedirs(workdir, exist_ok=True)
      path = os.path.join(workdir, "metrics.jsonl")
      _drop_rows_after(path, start_step)
      self._jsonl = open(path, "a")
      purge = None if start_step == 0 else start_step + 1
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)

  def write(self, step: int, scalars: dict):
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self._jsonl.flush()
    for k, v in scalars.items():
      self._tb.add_scalar(k, v, step)
    self._tb.flush()

  def close(self):
    if self.enabled:
      self._jsonl.close()
      self._tb.close()


def _drop_rows_after(path: str, step: int):
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = f.readlines()
  kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
  if len(kept) != len(lines):
    with written_whole(path) as pending, open(pending, "w") as f:
      f.writelines(kept)
