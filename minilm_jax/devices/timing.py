"""Timing on the devices and their peak FLOP/s (`chips.CHIPS`): what the benchmarks measure with."""

import os
import statistics
import time

import jax
import numpy as np

from minilm_jax.devices.chips import CHIPS, Chip


def median_seconds(fn, repeats: int) -> float:
  """Median wall time of `fn()` over `repeats` calls after one warm-up; `fn` must block until done."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def block(tree):
  return jax.block_until_ready(tree)


def timing_params(init, rng: np.random.Generator):
  """Parameters of the shapes `init(key)` returns, drawn from N(0, 0.02^2) in numpy, for timing: time
  does not depend on the values, and tracing the initialisers only for their shapes compiles
  nothing (JAX's initialisers, run op by op, compile a kernel per shape and draw with threefry:
  at BERT-base's shapes on a CPU they took longer than the timing, and ELMo's and the LSTMs'
  compiles longer than timing them)."""
  shapes = jax.eval_shape(init, jax.random.key(0))
  return jax.tree.map(lambda s: 0.02 * rng.standard_normal(s.shape, dtype=np.float32), shapes)


def chip_of(device_kind: str) -> Chip | None:
  """The row of `chips.CHIPS` a device of this kind is, or None (CPUs, chips not in the table): the
  longest name that starts `device_kind` wins (a v5e's "TPU v5 lite" also starts with a v5p's "TPU v5")."""
  named = [(len(k), c) for c in CHIPS.values() for k in c.device_kinds if device_kind.startswith(k)]
  return max(named, key=lambda n: n[0])[1] if named else None


def peak_flops():
  """The peak dense bfloat16 FLOP/s of this process's first device, or None on CPUs and unknown devices."""
  chip = chip_of(jax.devices()[0].device_kind)
  return None if chip is None else chip.peak_bf16_flops


def device_memory_bytes() -> int:
  """The memory this process's first device can hold: its allocator's limit on GPUs and TPUs, the
  host's physical memory on CPUs (whose devices report none)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
