"""The fused kernels checked and timed on the devices present: `python -m minilm_jax.kernels.check`.

Each kernel, compiled for this process's default backend (Triton on GPUs, Mosaic on TPUs,
interpreted on CPUs), is held to the explicit XLA path it replaces at the paper's head shapes
(student 12 heads of 32, teacher relations 12 heads of 64) with padded examples and the paper's
attention dropout: the loss and the gradients as relative errors (the largest absolute difference
over the largest absolute value), and both programs' forward+backward time. A chip the tests never
ran on (a new GPU generation, a new jax) is checked before a run trusts it.

  python -m minilm_jax.kernels.check --lengths 128,512 --batch 32 --dtype bfloat16
  python -m minilm_jax.kernels.check --lengths 512 --tilings 32x4x2,64x4x2,64x8x3,128x8x2   # tune a new chip

`--tilings` times other blocks, warps and pipeline stages than the platform's (`platform.TILINGS`,
which the steps use): the fastest belongs in that table.

Exits 1 when an error exceeds its tolerance (float32: 2e-3, where GPUs multiply in TF32;
bfloat16: 3e-2), so scripts can stop on it.
"""

import json
import sys

import jax
import jax.numpy as jnp
from absl import flags

from minilm_jax.devices.timing import median_seconds
from minilm_jax.errors import UserError
from minilm_jax.kernels import attention
from minilm_jax.kernels.platform import Tiling, compute_platform, tiling_for
from minilm_jax.training.outputs import check_new_file
from minilm_jax.training.program import run_program
from minilm_jax.transfer import losses

_LENGTHS = flags.DEFINE_list("lengths", ["128", "512"], "Sequence lengths to check (each one the kernels take).")
_BATCH = flags.DEFINE_integer(
  "batch", 32, "Examples per batch (every other one padded to 60% of the length).", lower_bound=2
)
_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["float32", "bfloat16"], "The operands' dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per program (the median is reported).", lower_bound=1)
_TILINGS = flags.DEFINE_list(
  "tilings", [], "Tilings to time, each BLOCKxWARPSxSTAGES (e.g. 64x4x2); default: the platform's (platform.TILINGS)."
)
_JSON = flags.DEFINE_string("json", None, "Also write the rows to this JSON file.")

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
        return losses.fused_relation_kl((tx, ty), (sx, sy), mask, HEADS, platform, tiling)
      t = losses.relation_log_probs(tx, ty, mask, HEADS)
      return losses.relation_kl(t, losses.relation_log_probs(sx, sy, mask, HEADS), mask)

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


def _timed(program, args, repeats):
  """(loss, gradients, median seconds) of a jitted value-and-gradient program."""
  loss, grads = program(*args)
  return loss, grads, median_seconds(lambda: jax.block_until_ready(program(*args)), repeats)


def check(lengths, batch: int, dtype: str, repeats: int, tilings=()) -> list[dict]:
  """One row per (kernel, tiling, length): errors against the explicit path and both programs' times."""
  platform = compute_platform()
  tilings = list(tilings) or [tiling_for(platform)]
  rows = []
  for length in lengths:
    for tiling in tilings:
      if not all(attention.supported(length, d, platform, tiling) for d in (STUDENT_DIM, TEACHER_DIM)):
        raise UserError(f"--lengths {length}: the kernels take multiples of their block or powers of two from 16")
    student, teacher, mask = _inputs(batch, length, jnp.dtype(dtype))
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
            "tiling": f"{tiling.block}x{tiling.num_warps}x{tiling.num_stages}",
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
          }
        )
  return rows


def main(argv):
  del argv
  try:
    tilings = [Tiling.parse(spec) for spec in _TILINGS.value]
  except (TypeError, ValueError):
    raise UserError(f"--tilings {','.join(_TILINGS.value)}: write each as BLOCKxWARPSxSTAGES, e.g. 64x4x2") from None
  if _JSON.value:
    check_new_file(_JSON.value, "--json")
  rows = check([int(n) for n in _LENGTHS.value], _BATCH.value, _DTYPE.value, _REPEATS.value, tilings)
  header = ("kernel", "tiling", "platform", "length", "loss err", "grad err", "fused ms", "XLA ms", "speedup")
  print("{:<12} {:<8} {:<9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8}".format(*header))
  for r in rows:
    print(
      f"{r['kernel']:<12} {r['tiling']:<8} {r['platform']:<9} {r['length']:>6} {r['loss_error']:>9.1e} "
      f"{r['grad_error']:>9.1e} {r['fused_ms']:>9.2f} {r['explicit_ms']:>9.2f} {r['speedup']:>7.2f}x"
    )
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(rows, f, indent=1)
  tolerance = TOLERANCE[_DTYPE.value]
  failed = [r for r in rows if max(r["loss_error"], r["grad_error"]) > tolerance]
  if failed:
    print(f"kernels differ from the explicit path by more than {tolerance:g}: {[r['kernel'] for r in failed]}")
    sys.exit(1)


if __name__ == "__main__":
  run_program(main)
