"""Timing, model FLOPs and device facts shared by the suites."""

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


def layer_flops_per_token(hidden: int, intermediate: int, length: int) -> int:
  """Forward FLOPs of one Transformer layer per token at sequence length `length`: the Q/K/V/output
  projections (8 d^2), the feed-forward block (4 d i), the scores and the weighted sum (4 S d).
  With i = 4d: 24 d^2 + 4 S d."""
  return 8 * hidden * hidden + 4 * hidden * intermediate + 4 * length * hidden


def encoder_flops_per_token(config, length: int) -> int:
  return config.num_layers * layer_flops_per_token(config.hidden_size, config.intermediate_size, length)


def distill_flops_per_token(
  teacher, teacher_layer: int, student, student_layer: int, length: int, num_relations: int = 2
) -> int:
  """Model FLOPs per token of one MiniLM step, counting only what the step must compute: each model's
  layers below the one the loss reads in full, plus that layer's Q/K/V (6 d^2) and the relation
  logits (2 S d each); the student's share three times (forward and backward)."""

  def share(config, layer):
    d = config.hidden_size
    below = layer * layer_flops_per_token(d, config.intermediate_size, length)
    return below + 6 * d * d + num_relations * 2 * length * d

  return share(teacher, teacher_layer) + 3 * share(student, student_layer)
