"""Scalar metrics to a JSONL file and TensorBoard event files; only process 0 writes."""

import json
import os

import jax


class MetricWriter:

  def __init__(self, workdir: str):
    self.enabled = jax.process_index() == 0
    if self.enabled:
      from tensorboardX import SummaryWriter

      os.makedirs(workdir, exist_ok=True)
      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

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
