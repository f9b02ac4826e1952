"""Where a distillation step's time goes, read from a `jax.profiler` trace: `bench distill --profile DIR`.

The step runs a few times under the profiler, each inside a `StepTraceAnnotation` ("step") that
blocks until the devices are done; every operation the trace records inside a step's window (its
`hlo_op`: the compiled module's instruction, on a CPU's thread or a GPU's stream) is put in one
part of the step by that instruction's name stack (`op_name`, which the step's named scopes and
JAX's transformations write) or by the kernel it calls:

- `teacher forward`: the `teacher` scope (no gradient flows through it);
- `student dense forward` / `backward`: the student encoder (`Encoder` under `jvp`, under
  `transpose(jvp(...))` for the backward pass) outside its attention kernel;
- `attention kernel forward` / `backward`: our flash kernel (`kernels.attention.FORWARD`, `BACKWARD`);
- `relation KL forward` / `backward`: the relation kernel (`kernels.relation_kl`), or the explicit
  relation loss where the kernel does not take the shape;
- `optimizer update`: the `optimizer` scope;
- `other`: everything else (random bits, casts, reductions of the metrics);
- `idle`: the step's wall time in which no operation ran.

Each part gets its milliseconds, its share of the step's wall time, the TFLOP/s of its analytic
FLOPs (`models.flops.distill_step_flops_by_part`) and the GB/s of the bytes its instructions read
and write (their operands and results, from the compiled module). Where operations run in parallel
(a CPU's threads, several GPU streams) the parts' milliseconds add up to more than the step.
"""

import collections
import glob
import gzip
import json
import os
import re

from minilm_jax.kernels import attention, relation_kl

PARTS = (
  "teacher forward",
  "student dense forward",
  "student dense backward",
  "attention kernel forward",
  "attention kernel backward",
  "relation KL forward",
  "relation KL backward",
  "optimizer update",
  "other",
  "idle",
)
STEP = "step"  # the name of the host annotation around each profiled step

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e\w+)\[([\d,]*)\]")
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128}


def _shape_bytes(dtype: str, dims: str) -> int:
  bits = _BITS.get(dtype) or int(re.sub(r"\D", "", dtype.split("e")[0]) or 8)
  count = 1
  for d in filter(None, dims.split(",")):
    count *= int(d)
  return count * bits // 8


def instructions(hlo_text: str) -> dict:
  """{instruction name: (part, bytes it reads and writes)} of every instruction of a compiled module
  (`compiled.as_text()`): its operands' and results' shapes as the line writes them."""
  out = {}
  for line in hlo_text.splitlines():
    found = _INSTRUCTION.match(line)
    if not found:
      continue
    name, rest = found.groups()
    body = rest.split(", metadata=")[0].split(", backend_config=")[0]
    size = sum(_shape_bytes(dtype, dims) for dtype, dims in _SHAPE.findall(body))
    op_name = _OP_NAME.search(rest)
    out[name] = (part_of(op_name.group(1) if op_name else "", rest), size)
  return out


def part_of(op_name: str, line: str = "") -> str:
  """The part of the step an instruction with name stack `op_name` (the first, where a fusion
  joins several with ";") and HLO `line` belongs to."""
  for kernel, forward, backward in (
    (attention, "attention kernel forward", "attention kernel backward"),
    (relation_kl, "relation KL forward", "relation KL backward"),
  ):
    if kernel.BACKWARD in line or kernel.BACKWARD in op_name:
      return backward
    if kernel.FORWARD in line or kernel.FORWARD in op_name:
      return forward
  scope = op_name.split(";")[0]
  if "/teacher/" in scope or scope.endswith("/teacher"):
    return "teacher forward"
  if "/optimizer/" in scope or scope.endswith("/optimizer"):
    return "optimizer update"
  transposed = "transpose(" in scope  # JAX's name for a backward pass
  if "Encoder" in scope and "jvp(" in scope:
    return "student dense backward" if transposed else "student dense forward"
  if "jvp(" in scope:  # the loss outside the encoders: the relations (explicit where no kernel takes them)
    return "relation KL backward" if transposed else "relation KL forward"
  return "other"


def read_trace(directory: str) -> dict:
  """The newest trace `jax.profiler.trace(directory)` wrote (its Chrome-format JSON)."""
  found = sorted(glob.glob(os.path.join(directory, "plugins", "profile", "*", "*.trace.json.gz")), key=os.path.getmtime)
  if not found:
    raise FileNotFoundError(f"no profiler trace under {directory}")
  with gzip.open(found[-1]) as f:
    return json.load(f)


def step_table(trace: dict, hlo_text: str, flops: dict) -> list:
  """One row per (profiled step, part): milliseconds, share of the step's wall time, TFLOP/s of the
  part's analytic `flops` ({part: FLOPs per step}), GB/s of the bytes its instructions move."""
  known = instructions(hlo_text)
  events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
  steps = sorted((e for e in events if e.get("name") == STEP), key=lambda e: e["ts"])
  ops = sorted((e["ts"], e["dur"], name) for e in events if (name := _instruction_of(e)) in known)
  rows = []
  for number, window in enumerate(steps):
    start, end = window["ts"], window["ts"] + window["dur"]
    inside = [(ts, dur, name) for ts, dur, name in ops if start <= ts and ts + dur <= end]
    busy: dict = collections.defaultdict(float)
    moved: dict = collections.defaultdict(int)
    for _, dur, name in inside:
      part, size = known[name]
      busy[part] += dur
      moved[part] += size
    busy["idle"] = window["dur"] - _covered([(ts, ts + dur) for ts, dur, _ in inside])
    for part in PARTS:
      seconds = busy[part] / 1e6
      rows.append(
        {
          "step": number,
          "part": part,
          "ms": busy[part] / 1e3,
          "share": busy[part] / window["dur"] if window["dur"] else None,
          "TFLOP/s": flops[part] / seconds / 1e12 if flops.get(part) and seconds else None,
          "GB/s": moved[part] / seconds / 1e9 if moved[part] and seconds else None,
        }
      )
  return rows


def _instruction_of(event: dict) -> str:
  """The compiled instruction an operation's event ran: its `hlo_op` argument (CPU threads, GPU
  streams), else its name (a CPU's events are named by it)."""
  args = event.get("args")
  return args.get("hlo_op", event["name"]) if isinstance(args, dict) else event["name"]


def _covered(intervals: list) -> float:
  """The length of the union of (start, end) intervals."""
  total, reach = 0.0, float("-inf")
  for start, end in sorted(intervals):
    if end > reach:
      total += end - max(start, reach)
      reach = end
  return total
