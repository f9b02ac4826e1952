"""The fused kernels checked and timed on the devices present: `python -m minilm_jax.bench kernels`.

Each kernel, compiled for this process's default backend (Triton on GPUs, Mosaic on TPUs,
interpreted on CPUs), is held to the explicit XLA path it replaces at the paper's head shapes
(student 12 heads of 32, teacher relations 12 heads of 64) with padded examples and the paper's
attention dropout: the loss and the gradients as relative errors (the largest absolute difference
over the largest absolute value), and both programs' forward+backward time, with the TFLOP/s of
their matrix products (`matmul_flops`), the kernel's share of the chip's bfloat16 peak, the
kernel's own bound on the chip (`bound`: the least time its products, exponentials, integer and
other vector instructions and HBM bytes allow, `kernels.costs` over `chips.CHIPS`' rates) and the
share of it the kernel reaches, and, for the attention on GPUs, cuDNN's fused attention without
dropout (the teacher's path) as what a tuned kernel reaches. A chip the tests never ran on (a new
GPU generation, a new jax) is checked before a run trusts it.

  python -m minilm_jax.bench kernels --dtype bfloat16     # the paper's batch 256 x 128 and x 512
  python -m minilm_jax.bench kernels --seq_len 32 --batch 2  # a CPU, interpreted (float32)
  python -m minilm_jax.bench kernels --dtype bfloat16 --tune   # tune this chip: the step reads the table

`--tilings` times other blocks, warps and pipeline stages than the step's (the tuned table's or the
platform's, `platform.tiling_for`). `--tune` times each kernel's forward and backward pass alone
over a grid of tilings (`--tilings`, or `TUNING_GRID`'s for the platform), skips those that do not
compile, and writes the fastest of each (chip, kernel, head sizes, length) to the tuned table
(`kernels.platform.TUNED_TABLE`) with its time and the date: the steps compiled for that chip read it.

`bench kernels` exits 1 when an error exceeds its tolerance (float32: 2e-3, where GPUs multiply in
TF32; bfloat16: 3e-2), so scripts can stop on it.
"""

import datetime
import logging

import jax
import jax.numpy as jnp

from minilm_jax.cli.outputs import write_json
from minilm_jax.devices.chips import GiB
from minilm_jax.devices.timing import chip_of, device_memory_bytes, median_seconds, peak_flops
from minilm_jax.errors import UserError
from minilm_jax.kernels import attention, costs
from minilm_jax.kernels import platform as pallas_platform
from minilm_jax.kernels.platform import Tiling, compute_platform, tiling_for
from minilm_jax.models.attention import fused_attention, fused_attention_implementation
from minilm_jax.models.flops import attention_kernel_flops, relation_kl_flops
from minilm_jax.transfer import relations

TOLERANCE = {"float32": 2e-3, "bfloat16": 3e-2}
HEADS, STUDENT_DIM, TEACHER_DIM, DROPOUT = 12, 32, 64, 0.1


def _relative(got, want) -> float:
  """The largest absolute difference over the largest absolute value, the worst of the leaves."""
  errors = []
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = g.astype(jnp.float32), w.astype(jnp.float32)
    errors.append(float(jnp.max(jnp.abs(g - w))) / float(jnp.max(jnp.abs(w))))
  return max(errors)


def _inputs(batch, length, dtype):
  """Normal [B, H, L, K] projections (student and teacher) and a key mask padding every other example."""
  keys = jax.random.split(jax.random.key(0), 5)
  student = [jax.random.normal(k, (batch, HEADS, length, STUDENT_DIM), dtype) for k in keys[:3]]
  teacher = [jax.random.normal(k, (batch, HEADS, length, TEACHER_DIM), dtype) for k in keys[3:]]
  real = jnp.where(jnp.arange(batch) % 2, int(0.6 * length), length)
  return student, teacher, jnp.arange(length)[None, :] < real[:, None]


def _programs(platform, tiling, student, teacher, mask):
  """(name, fused loss, explicit loss, differentiated arguments, the other arguments). The
  constants are arguments too: closed over, XLA would fold the explicit path's products into
  constants while compiling."""
  weights = jax.random.normal(jax.random.key(1), student[0].shape, jnp.float32).transpose(0, 2, 1, 3)

  def attention_loss(fn):
    # The kernels take the encoder's [B, L, H, K]; padding queries' outputs are weighed 0.
    def loss(q, k, v, weights, mask):
      context = fn(*(x.transpose(0, 2, 1, 3) for x in (q, k, v)), mask)
      return jnp.sum(context.astype(jnp.float32) * weights * mask[:, :, None, None])

    return loss

  def relation_loss(fused):
    def loss(sx, sy, tx, ty, mask):
      if fused:
        return relations.fused_relation_kl((tx, ty), (sx, sy), mask, HEADS, platform, tiling)
      t = relations.relation_log_probs(tx, ty, mask, HEADS)
      return relations.relation_kl(t, relations.relation_log_probs(sx, sy, mask, HEADS), mask)

    return loss

  return [
    (
      "attention",
      attention_loss(
        lambda q, k, v, mask: attention.flash_attention(q, k, v, mask, 7, DROPOUT, platform, None, tiling)
      ),
      attention_loss(lambda q, k, v, mask: attention.reference(q, k, v, mask, 7, DROPOUT)),
      student,
      (weights, mask),
    ),
    ("relation_kl", relation_loss(True), relation_loss(False), student[:2], (*teacher, mask)),
  ]


def matmul_flops(kernel: str, batch: int, length: int) -> int:
  """FLOPs of the matrix products in one forward+backward call of `kernel` at the paper's heads
  (`models.flops`): one layer's attention at the student's, or one relation KL between the
  teacher's and the student's."""
  if kernel == "attention":
    return sum(attention_kernel_flops(batch, length, HEADS * STUDENT_DIM))
  return sum(relation_kl_flops(batch, length, HEADS * TEACHER_DIM, HEADS * STUDENT_DIM))


def cudnn_loss(q, k, v, mask):
  """A loss through the teacher's attention path (`attention.fused_attention`: cuDNN's fused kernel on
  GPUs in half precision, without dropout, the padding as lengths) at the student's heads."""
  q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # the encoder's [B, L, H, K]
  return jnp.sum(fused_attention(q, k, v, mask).astype(jnp.float32))


def _cudnn_reference(student, mask, repeats) -> float | None:
  """Seconds of `cudnn_loss`'s forward+backward: what a tuned kernel reaches on this chip; None where
  the path is not cuDNN's (CPUs, TPUs, float32)."""
  if fused_attention_implementation(student[0].dtype, STUDENT_DIM) != "cudnn":
    return None
  return _timed(jax.jit(jax.value_and_grad(cudnn_loss, (0, 1, 2))), (*student, mask), repeats)[2]


def _timed(program, args, repeats):
  """(loss, gradients, median seconds) of a jitted value-and-gradient program."""
  loss, grads = program(*args)
  return loss, grads, median_seconds(lambda: jax.block_until_ready(program(*args)), repeats)


def _check(lengths, batch: int, dtype: str, tilings, explicit: bool = True):
  """One line for what this device cannot run: bfloat16 on a CPU, a damaged tuned table, a length no
  tiling takes, and inputs (and with `explicit`, the explicit path's attention scores) past the
  device's memory."""
  if dtype == "bfloat16" and jax.default_backend() == "cpu":
    # XLA's CPU backend has no bfloat16 x bfloat16 -> float32 product, which both paths ask for.
    raise UserError("--dtype bfloat16: XLA's CPU backend cannot run bfloat16 products: use --dtype float32 on a CPU")
  pallas_platform.tuned_tilings(pallas_platform.TUNED_TABLE)  # a damaged table: refused before any timing
  capacity = device_memory_bytes()
  for length in lengths:
    # The inputs (three student and two teacher projections); the explicit path keeps its [B, H, L, L]
    # float32 scores and their probabilities for the backward pass, which adds their gradient.
    needed = batch * HEADS * length * (3 * STUDENT_DIM + 2 * TEACHER_DIM) * jnp.dtype(dtype).itemsize
    needed += 3 * batch * HEADS * length * length * 4 if explicit else 0
    if needed > capacity:
      raise UserError(
        f"--batch {batch} --seq_len {length}: the inputs{' and the explicit path' if explicit else ''} take at "
        f"least {needed / GiB:,.1f} GiB, and this device has {capacity / GiB:,.1f} GiB: lower --batch or --seq_len"
      )
    for tiling in tilings:
      if not all(attention.supported(length, d, compute_platform(), tiling) for d in (STUDENT_DIM, TEACHER_DIM)):
        raise UserError(f"--seq_len {length}: the kernels take multiples of their block or powers of two from 16")


def _label(tiling: Tiling | None, kernel: str, length: int) -> str:
  """A tiling as BLOCKxWARPSxSTAGES; the step's (None): its forward's and backward's."""
  if tiling is not None:
    return f"{tiling.block}x{tiling.num_warps}x{tiling.num_stages}"
  return "/".join(_label(tiling_for(compute_platform(), name, dims, length), "", 0) for name, dims in _CALLS[kernel])


def run(lengths, batch: int, dtype: str, repeats: int, tilings=()) -> list[dict]:
  """One row per (kernel, tiling, length): errors against the explicit path, both programs' times
  and the kernel's bound. No `tilings`: the step's (the tuned table's or the platform's)."""
  platform = compute_platform()
  tilings = list(tilings) or [None]
  _check(lengths, batch, dtype, tilings)
  rows = []
  for length in lengths:
    student, teacher, mask = _inputs(batch, length, jnp.dtype(dtype))
    cudnn_seconds = _cudnn_reference(student, mask, repeats)
    explicit_runs = {}
    for tiling in tilings:
      for name, fused, explicit, differentiated, constants in _programs(platform, tiling, student, teacher, mask):
        args = (*differentiated, *constants)
        argnums = tuple(range(len(differentiated)))
        if name not in explicit_runs:
          explicit_runs[name] = _timed(jax.jit(jax.value_and_grad(explicit, argnums)), args, repeats)
        loss, grads, seconds = explicit_runs[name]
        fused_loss, fused_grads, fused_seconds = _timed(jax.jit(jax.value_and_grad(fused, argnums)), args, repeats)
        rows.append(
          {
            "kernel": name,
            "tiling": _label(tiling, name, length),
            "platform": platform,
            "device": jax.devices()[0].device_kind,
            "batch": batch,
            "length": length,
            "dtype": dtype,
            "loss_error": _relative(fused_loss, loss),
            "grad_error": _relative(fused_grads, grads),
            "fused_ms": 1e3 * fused_seconds,
            "explicit_ms": 1e3 * seconds,
            "speedup": seconds / fused_seconds,
            **_rates(
              matmul_flops(name, batch, length), fused_seconds, seconds, cudnn_seconds if name == "attention" else None
            ),
            **_bound_row(name, batch, length, jnp.dtype(dtype).itemsize, fused_seconds),
          }
        )
  return rows


# Each kernel's Pallas calls at the paper's heads: (name, head sizes) as the tuned table keys them.
_CALLS: dict[str, list[tuple[str, tuple[int, ...]]]] = {
  "attention": [(attention.FORWARD, (STUDENT_DIM,)), (attention.BACKWARD, (STUDENT_DIM,))],
  "relation_kl": [
    (costs.RELATION_KL_FORWARD, (TEACHER_DIM, STUDENT_DIM)),
    (costs.RELATION_KL_BACKWARD, (TEACHER_DIM, STUDENT_DIM)),
  ],
}


def work(kernel: str, batch: int, length: int, itemsize: int) -> dict:
  """{Pallas call name: `costs.Work`} of one forward+backward call of `kernel` at the paper's heads."""
  if kernel == "attention":
    return costs.attention(batch, HEADS, length, STUDENT_DIM, DROPOUT, itemsize)
  return costs.relation_kl(batch, HEADS, length, TEACHER_DIM, STUDENT_DIM, itemsize)


def bound(calls: dict, chip) -> tuple[float, str]:
  """The least seconds `calls` ({name: `costs.Work`}, run one after another) can take on `chip`: each
  call at the largest of its products' time at the bf16 peak, its exponentials' on the
  transcendental units, its integer instructions' on the integer units, all its vector
  instructions' at the issue rate, and its bytes' at the HBM bandwidth; and the resource that
  bounds most of that time. Without published vector rates (TPUs), products and bytes alone."""
  total, by_resource = 0.0, dict[str, float]()
  for w in calls.values():
    seconds = {"products": w.products / chip.peak_bf16_flops, "hbm": w.hbm_bytes / chip.hbm_bytes_per_s}
    if chip.vector:
      v = chip.vector
      seconds["exp"] = w.exponentials / v.per_second(v.transcendentals)
      seconds["integer"] = w.integer_ops / v.per_second(v.integer_ops)
      seconds["issue"] = w.vector_ops / v.per_second(v.issued)
    limit = max(seconds, key=lambda resource: seconds[resource])
    total += seconds[limit]
    by_resource[limit] = by_resource.get(limit, 0.0) + seconds[limit]
  return total, max(by_resource, key=lambda resource: by_resource[resource])


def _bound_row(kernel: str, batch: int, length: int, itemsize: int, seconds: float) -> dict:
  """The kernel's bound on this process's chip, what bounds it, and the measured time's share of it
  (the bound over the time: 1 is the bound reached); None on chips without a row (CPUs)."""
  chip = chip_of(jax.devices()[0].device_kind)
  if chip is None:
    return {"bound_ms": None, "bound_by": None, "of_bound": None}
  least, limit = bound(work(kernel, batch, length, itemsize), chip)
  return {"bound_ms": 1e3 * least, "bound_by": limit, "of_bound": least / seconds}


def _rates(flops: float, fused: float, explicit: float, cudnn: float | None) -> dict:
  """The TFLOP/s of a kernel's matrix products (`flops`) in the fused kernel's, the explicit path's
  and (attention, on GPUs) cuDNN's kernel without dropout's seconds, and the fused kernel's share
  of the chip's bf16 peak (None where the table has no peak: CPUs)."""
  peak = peak_flops()
  return {
    "fused_tflops": flops / fused / 1e12,
    "explicit_tflops": flops / explicit / 1e12,
    "fused_peak_share": flops / fused / peak if peak else None,
    "cudnn_no_dropout_ms": 1e3 * cudnn if cudnn else None,
    "cudnn_no_dropout_tflops": flops / cudnn / 1e12 if cudnn else None,
  }


# What `--tune` times where no --tilings are given: on GPUs blocks of 32 to 128 rows with 4 warps
# and 2 or 3 pipeline stages or 8 warps and 2 (the register budget: a [64, 64] float32 block and
# its hash words take about 64 registers a thread at 4 warps); on TPUs blocks alone (Mosaic takes
# no warps), 128 rows filling the lanes and more.
TUNING_GRID = {
  "gpu": [Tiling(block, warps, stages) for block in (32, 64, 128) for warps, stages in ((4, 2), (4, 3), (8, 2))],
  "tpu": [Tiling(block) for block in (128, 256, 512)],
}


def tune(lengths, batch: int, dtype: str, repeats: int, tilings=(), table: str = "") -> list[dict]:
  """Each kernel's forward and backward pass timed alone (the backward as forward+backward less the
  forward) in every tiling of `tilings` (else `TUNING_GRID`'s), those that do not compile skipped;
  the fastest of each (chip, kernel call, head sizes, length) written to `table` (default the
  package's, `kernels.platform.TUNED_TABLE`), kept entries of other shapes and chips. One row per call and
  tiling."""
  here = compute_platform()
  grid = list(tilings) or TUNING_GRID.get("gpu" if here in pallas_platform.GPU_PLATFORMS else here, [])
  if not grid:
    raise UserError(f"--tune on {here}: name the tilings to time with --tilings, e.g. 32x4x2,64x4x2")
  _check(lengths, batch, dtype, [], explicit=False)
  kind, table = jax.devices()[0].device_kind, table or pallas_platform.TUNED_TABLE
  pallas_platform.tuned_tilings(table)  # a damaged table is refused before the timings, not after
  rows, fastest = list[dict](), dict[str, dict]()
  for length in lengths:
    student, teacher, mask = _inputs(batch, length, jnp.dtype(dtype))
    for tiling in grid:
      if not all(attention.supported(length, d, here, tiling) for d in (STUDENT_DIM, TEACHER_DIM)):
        continue
      for name, fused, _, differentiated, constants in _programs(here, tiling, student, teacher, mask):
        for call, dims, seconds in _timed_calls(name, fused, differentiated, constants, repeats):
          entry = {
            "chip": kind,
            "kernel": call,
            "dims": list(dims),
            "length": length,
            "tiling": _label(tiling, "", 0),
            "ms": None if seconds is None else 1e3 * seconds,
          }
          rows.append(entry)
          key = pallas_platform.tuned_key(kind, call, dims, length)
          if seconds is not None and (key not in fastest or entry["ms"] < fastest[key]["ms"]):
            fastest[key] = {**entry, "batch": batch, "dtype": dtype, "date": datetime.date.today().isoformat()}
  _write_table(table, fastest)
  return rows


def _timed_calls(name, fused, differentiated, constants, repeats):
  """[(call name, head sizes, seconds)] of `name`'s forward and backward calls, seconds None where
  the tiling does not compile on this chip (too many registers, too much shared memory)."""
  args, argnums = (*differentiated, *constants), tuple(range(len(differentiated)))
  forward, both = jax.jit(fused), jax.jit(jax.value_and_grad(fused, argnums))
  try:
    forward_s = median_seconds(lambda: jax.block_until_ready(forward(*args)), repeats)
    both_s = median_seconds(lambda: jax.block_until_ready(both(*args)), repeats)
  except Exception as e:  # noqa: BLE001 - a tiling the compiler refuses is skipped, whatever its error
    logging.warning("bench kernels --tune: %s skipped: %s", name, str(e).splitlines()[0] if str(e) else type(e))
    return [(call, dims, None) for call, dims in _CALLS[name]]
  (forward_call, forward_dims), (backward_call, backward_dims) = _CALLS[name]
  return [(forward_call, forward_dims, forward_s), (backward_call, backward_dims, max(both_s - forward_s, 0.0))]


def _write_table(path: str, fastest: dict):
  """`fastest`'s entries into the tuned table at `path`, over the entries of the same keys."""
  entries = dict(pallas_platform.tuned_tilings(path))
  entries.update(fastest)
  write_json(path, dict(sorted(entries.items())))
  pallas_platform.tuned_tilings.cache_clear()


def parse_tilings(specs) -> list:
  try:
    return [Tiling.parse(spec) for spec in specs]
  except ValueError as e:
    raise UserError(f"--tilings {','.join(specs)}: {e}") from None


def beyond_tolerance(rows) -> list:
  """The rows whose loss or gradient differs from the explicit path by more than their dtype allows."""
  return [r for r in rows if max(r["loss_error"], r["grad_error"]) > TOLERANCE[r["dtype"]]]
