"""Timing on the devices and their peak FLOP/s: what the benchmarks and the kernels' check measure with."""

import statistics
import time

import jax

# Peak dense bfloat16 FLOP/s per device, for model-FLOPs utilisation on accelerators (vendor
# figures), matched against the start of `device_kind`.
PEAK_FLOPS = {
  "TPU v4": 275e12,
  "TPU v5 lite": 197e12,
  "TPU v5e": 197e12,
  "TPU v5p": 459e12,
  "TPU v6 lite": 918e12,
  "NVIDIA A100": 312e12,
  "NVIDIA H100": 989e12,
  "NVIDIA H200": 989e12,
}


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


def peak_flops():
  """The peak FLOP/s of this process's first device, or None on CPUs and unknown devices."""
  kind = jax.devices()[0].device_kind
  return next((peak for prefix, peak in PEAK_FLOPS.items() if kind.startswith(prefix)), None)
