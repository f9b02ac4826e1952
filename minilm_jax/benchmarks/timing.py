"""Wall-clock timing shared by the suites: one warm-up call (compilation), then the median of repeats."""

import statistics
import time

import jax

# Peak dense bfloat16 FLOP/s per device, for model-FLOPs utilisation on accelerators (vendor figures).
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12, "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA H100 80GB HBM3": 989e12,
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
  return PEAK_FLOPS.get(jax.devices()[0].device_kind)
