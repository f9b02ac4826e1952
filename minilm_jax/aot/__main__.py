"""Compile a program for an accelerator that is not attached, and report what the chip would run:

  python -m minilm_jax.aot --config configs/minilm_6x384.py --target h100x8 [--program train]
      [--config.<field>=<value> ...] [--json FILE] [--find_batch] [--model_shape 12x768]

Targets: TPU slices (v4-8, v5e-8, v5p-8, v6e-8, v5e-256, ..., `x<slices>` for several) and H100
hosts (h100x1, h100x8, h100x8x2). Prints, per device: argument, output, temporary and peak bytes
against the chip's memory, whether it fits, XLA's FLOPs per step beside our analytic count, bytes
accessed, the bytes its collectives move, the attention kernel, tokens per step and the tokens/s
the chip's roofline allows: the step takes at least its FLOPs at the peak bf16 rate or its bytes at
the HBM bandwidth, whichever is longer (a bound, not a measurement: no time is measured here).
A program that does not fit is one line and exit 2; `--find_batch` reports the largest global
batch that fits instead. Needs the `aot` extra (pip install -e ".[aot]").
"""

import glob
import math
import os
import shutil
import tempfile

import jax
from absl import flags
from ml_collections import config_flags

from minilm_jax.aot import programs, report
from minilm_jax.aot.compiling import DoesNotFit, compile_program
from minilm_jax.aot.targets import compile_devices, examples, parse_target
from minilm_jax.cli.outputs import check_new_file, write_json
from minilm_jax.cli.program import Program, run_program
from minilm_jax.devices.chips import GiB
from minilm_jax.errors import UserError

PROGRAM = Program()
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "A train or finetune config file (configs/*.py).", flag_values=PROGRAM.flag_values
)
_TARGET = flags.DEFINE_string(
  "target",
  None,
  f"What to compile for: {', '.join(examples())}, ... (devices/chips.py's CHIPS).",
  flag_values=PROGRAM.flag_values,
)
_PROGRAM = flags.DEFINE_string(
  "program", "", "train, finetune or evaluate (default: the config's own).", flag_values=PROGRAM.flag_values
)
_JSON = flags.DEFINE_string("json", "", "Also write the report to this JSON file.", flag_values=PROGRAM.flag_values)
_FIND_BATCH = flags.DEFINE_bool(
  "find_batch", False, "Report the largest global batch that fits.", flag_values=PROGRAM.flag_values
)
_PEAK_BUFFERS = flags.DEFINE_integer(
  "peak_buffers",
  0,
  "Also list what is live at the peak (XLA's buffer assignment): the N largest sources.",
  lower_bound=0,
  flag_values=PROGRAM.flag_values,
)
_MODEL_SHAPE = flags.DEFINE_string(
  "model_shape",
  "",
  "The pre-trained model's shape (LAYERSxHIDDEN[xHEADS]) when its config.json is not at hand.",
  flag_values=PROGRAM.flag_values,
)
flags.mark_flags_as_required(["config", "target"], flag_values=PROGRAM.flag_values)


def peak_buffers(dump_dir: str, target, compiled, top: int) -> list:
  """What is live at the compiled program's peak, by source (`report.peak_buffers`), from the live
  ranges XLA dumped into `dump_dir` as it compiled (the main module's: the largest dump)."""
  dumps = sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations-live-range.txt")), key=os.path.getsize)
  if not dumps:
    raise UserError(f"--peak_buffers: the compiler for {target.name} wrote no live ranges; try an H100 target")
  with open(dumps[-1]) as f:
    return report.peak_buffers(f.read(), compiled.as_text(), top)


def analyse(program, target, compiled, seconds: float) -> dict:
  text = compiled.as_text()
  row = {
    "target": target.name,
    "program": program.name,
    "devices": target.num_devices,
    "mesh": dict(program.mesh.shape),
    "global_batch": program.global_batch,
    **report.memory(compiled),
    "device_memory_bytes": target.chip.memory_bytes,
    "usable_memory_bytes": target.usable_memory_bytes,
    "memory_source": target.chip.source,
  }
  row["fits"] = row["peak_bytes_per_device"] <= target.usable_memory_bytes
  costs = report.costs(compiled, target.chip.platform)
  calls = report.kernel_calls(text)
  kernel = report.attention_kernel(text, calls)
  # Kernels the cost models count as nothing: cuDNN's attention, cuBLAS's products and our Pallas
  # kernels, their FLOPs analytically and their bytes as operands read and results written once.
  cudnn_flops, pallas_flops = report.cudnn_attention_flops(text), report.pallas_kernel_flops(calls)
  cublas_flops = sum(c["flops"] for c in calls)
  kernel_bytes = sum(c["bytes"] for c in calls)
  uncounted = cudnn_flops + pallas_flops + cublas_flops
  flops = (costs["flops"] + uncounted) * target.num_devices
  matmuls = report.matmul_flops(text)
  matmuls = None if matmuls is None else (matmuls + uncounted) * target.num_devices
  analytic = program.analytic_flops_per_step
  bytes_per_device = costs["bytes_accessed"] + kernel_bytes
  bound = report.roofline(costs["flops"] + uncounted, bytes_per_device, target.chip)
  row.update(
    flops_per_step=flops,
    cudnn_attention_flops_added=cudnn_flops * target.num_devices,
    pallas_kernel_flops_added=pallas_flops * target.num_devices,
    cublas_flops_added=cublas_flops * target.num_devices,
    matmul_flops_per_step=matmuls,
    analytic_flops_per_step=analytic,
    flops_over_analytic=flops / analytic if analytic else None,
    matmul_flops_over_analytic=matmuls / analytic if analytic and matmuls else None,
    bytes_accessed_per_step=bytes_per_device * target.num_devices,
    kernel_bytes_added=kernel_bytes * target.num_devices,
    collective_bytes_per_device=report.collective_bytes(text),
    **kernel,
    tokens_per_step=program.tokens_per_step,
    peak_flops_per_s=target.chip.peak_bf16_flops,
    hbm_bytes_per_s=target.chip.hbm_bytes_per_s,
    **bound,
    # Every device runs its share of the step at once: the step's tokens over one device's bound.
    tokens_per_s_bound=program.tokens_per_step / bound["step_time_bound_s"],
    compile_s=round(seconds, 2),
  )
  return row


def peak_at(name: str, config, target, devices, batch: int) -> float:
  """Peak bytes per device of program `name` at `batch` (the compiler's figure when it refuses)."""
  try:
    compiled, _ = compile_program(build(name, config, devices, batch), target)
  except DoesNotFit as e:
    return e.needed
  return report.memory(compiled)["peak_bytes_per_device"]


def build(name: str, config, devices, batch: int | None = None):
  """Program `name` of `config` on `devices`, at its own batch or at `batch`."""
  if batch is not None:
    config = config.copy_and_resolve_references()
    with config.unlocked():
      setattr(config, "eval_batch_size" if name == "evaluate" else "batch_size", batch)
  return programs.PROGRAMS[name](config, devices, _MODEL_SHAPE.value)


def find_batch(config, target, devices, program, peak_now: float) -> tuple:
  """(the largest global batch that fits, 0 when none does; {batch: peak bytes per device} of every
  batch compiled on the way). The config's own batch is not compiled again."""
  unit = program.mesh.shape["data"] * (config.optimizer.accumulate_steps if program.name != "evaluate" else 1)
  known = {program.global_batch: peak_now}

  def peak(batch):
    if batch not in known:
      known[batch] = peak_at(program.name, config, target, devices, batch)
    return known[batch]

  largest = programs.largest_batch(peak, program.global_batch, unit, target.usable_memory_bytes)
  return largest, dict(sorted(known.items()))


def _fix(program) -> str:
  if program.name == "evaluate":
    return f"lower eval_batch_size (now {program.global_batch}), or use a larger slice"
  return (
    f"raise optimizer.accumulate_steps, or lower {program.batch_field} (now {program.global_batch}), "
    f"or use a larger slice (--find_batch finds the largest batch that fits)"
  )


def _gib(n: float) -> str:
  return f"{n / GiB:.2f}"


def _cost_lines(row: dict) -> list:
  """The report's lines on the compiled program's costs: FLOPs (XLA's, the kernels' added, the
  analytic count), bytes, collectives, attention and the roofline bound."""
  analytic = row["analytic_flops_per_step"]
  matmuls = row["matmul_flops_per_step"]
  versus = (
    f"analytic {analytic:.3e} (XLA / analytic {row['flops_over_analytic']:.3f}" if analytic else "no analytic count"
  )
  if matmuls is not None and analytic:
    versus += f"; matrix products {matmuls:.3e}, {row['matmul_flops_over_analytic']:.3f} of the analytic count)"
  elif analytic:
    versus += "; matrix products not counted: this compiler writes them as dilated convolutions)"
  elif matmuls is not None:
    versus += f"; matrix products {matmuls:.3e}"
  added = [
    f"{row[field]:.3e} in {what}"
    for field, what in (
      ("cudnn_attention_flops_added", "cuDNN attention"),
      ("cublas_flops_added", "cuBLAS products"),
      ("pallas_kernel_flops_added", "Pallas kernels"),
    )
    if row[field]
  ]
  kernels = f", of which {', '.join(added)}, counted analytically" if added else ""
  in_kernels = (
    f", of which {row['kernel_bytes_added']:.3e} in kernel calls' operands and results"
    if row["kernel_bytes_added"]
    else ""
  )
  collectives = ", ".join(f"{k} {v / (1 << 20):.1f} MiB" for k, v in row["collective_bytes_per_device"].items())
  pallas = ", ".join(f"{n} {k}" for k, n in row["pallas_kernel_calls"].items())
  return [
    ("FLOPs per step", f"{row['flops_per_step']:.3e} (XLA{kernels}); {versus}"),
    ("bytes accessed", f"{row['bytes_accessed_per_step']:.3e} per step (XLA{in_kernels})"),
    ("collectives", f"{collectives or 'none'} per device per step"),
    (
      "attention",
      f"{row['attention_kernel']} ({row['cudnn_attention_calls']} cuDNN calls; Pallas: {pallas or 'none'})",
    ),
    (
      "step time bound",
      f"{row['step_time_bound_s'] * 1e3:.1f} ms, bound by "
      f"{'HBM bandwidth' if row['bound_by'] == 'hbm' else 'FLOPs'}: "
      f"the longer of FLOPs at {row['peak_flops_per_s'] / 1e12:.0f} TFLOP/s and bytes at "
      f"{row['hbm_bytes_per_s'] / 1e12:.2f} TB/s per chip; {row['tokens_per_s_bound']:.3e} tokens/s at most "
      "(a bound, not a measurement)",
    ),
    ("compile", f"{row['compile_s']} s"),
  ]


def describe(row: dict) -> str:
  """The report as a person reads it: one line per subject."""
  lines = [("target", f"{row['target']}, compiled on this host (not run)"), ("program", row["program"])]
  if "global_batch" in row:
    mesh = " x ".join(f"{k} {v}" for k, v in row["mesh"].items())
    lines += [
      ("batch", f"{row['global_batch']} global over mesh {mesh}; {row['tokens_per_step']:,} tokens per step"),
      (
        "memory per device",
        f"arguments {_gib(row['argument_bytes_per_device'])} GiB, outputs {_gib(row['output_bytes_per_device'])} "
        f"GiB ({_gib(row['alias_bytes_per_device'])} of them in donated arguments), temporaries "
        f"{_gib(row['temp_bytes_per_device'])} GiB",
      ),
    ]
  verdict = "fits" if row["fits"] else "does NOT fit"
  lines.append(
    (
      "peak per device",
      f"{'at least ' if row.get('peak_is_a_lower_bound') else ''}{_gib(row['peak_bytes_per_device'])} GiB "
      f"of {_gib(row['usable_memory_bytes'])} GiB usable "
      f"({_gib(row['device_memory_bytes'])} GiB on the chip): {verdict}",
    )
  )
  if "flops_per_step" in row:
    lines += _cost_lines(row)
  if "largest_global_batch" in row:
    searched = ", ".join(f"{batch}: {_gib(peak)}" for batch, peak in row["searched_peak_bytes_per_device"].items())
    lines += [
      ("largest global batch", f"{row['largest_global_batch']} fits (searched to within an eighth)"),
      ("searched", f"GiB per device at each batch compiled: {searched}"),
    ]
  width = max(len(k) for k, _ in lines)
  text = "\n".join(f"{k:<{width}}  {v}" for k, v in lines)
  if row.get("peak_buffers"):
    text += "\n\nlive at the peak, by source (XLA's buffer assignment), GiB per device:\n" + "\n".join(
      f"  {_gib(r['bytes']):>7}  {r['buffers']:>4} buffers  {r['source']}" for r in row["peak_buffers"]
    )
  return text


def _needed(peak_bytes: float, at_least: bool = False) -> str:
  """The memory a program over the chip needs, as the compiler said it (or that it did not say)."""
  if math.isnan(peak_bytes):
    return "more memory than the chip has (the compiler did not say how much)"
  return f"{'at least ' if at_least else ''}{_gib(peak_bytes)} GiB"


def main(argv):
  del argv
  config = _CONFIG.value
  target = parse_target(_TARGET.value or "")  # a required flag: never None here
  name = _PROGRAM.value or programs.default_program(config)
  programs.check_program(name, config)
  if _JSON.value:
    check_new_file(_JSON.value, "--json")
  # Compiling only: the host's own CPU backend, whatever plugins are installed.
  jax.config.update("jax_platforms", "cpu")
  devices = compile_devices(target)
  program = build(name, config, devices)
  chip = target.name.split("-")[0].split("x")[0]
  # With --peak_buffers the one compile also dumps XLA's live ranges, read after the report.
  dump_dir = tempfile.mkdtemp(prefix="minilm_jax_aot_") if _PEAK_BUFFERS.value > 0 else ""
  try:
    try:
      compiled, seconds = compile_program(program, target, dump_dir)
      row = analyse(program, target, compiled, seconds)
    except DoesNotFit as e:
      row = {"target": target.name, "program": program.name, "fits": False, "peak_bytes_per_device": e.needed}
      row["peak_is_a_lower_bound"] = e.at_least
      row.update(device_memory_bytes=target.chip.memory_bytes, usable_memory_bytes=target.usable_memory_bytes)
    if dump_dir and row["fits"]:
      row["peak_buffers"] = peak_buffers(dump_dir, target, compiled, _PEAK_BUFFERS.value)
  finally:
    if dump_dir:
      shutil.rmtree(dump_dir, ignore_errors=True)
  if _FIND_BATCH.value:
    row["largest_global_batch"], searched = find_batch(config, target, devices, program, row["peak_bytes_per_device"])
    row["searched_peak_bytes_per_device"] = {str(batch): peak for batch, peak in searched.items()}
  print(describe(row))
  if _JSON.value:
    write_json(_JSON.value, row)
  if not row["fits"] and not _FIND_BATCH.value:
    needed = _needed(row["peak_bytes_per_device"], row.get("peak_is_a_lower_bound", False))
    raise UserError(
      f"{program.name} needs {needed} per device at "
      f"{program.batch_field}={program.global_batch}, and {target.name}'s {chip} has "
      f"{_gib(target.usable_memory_bytes)} GiB{' usable' if target.chip.platform == 'cuda' else ''}: "
      f"{_fix(program)}"
    )


if __name__ == "__main__":
  run_program(main, PROGRAM)
