"""What a compiled program says about itself: memory per device, FLOPs, bytes accessed, the bytes
its collectives move, which attention kernels it runs, and the step time its chip's peak FLOP/s
and HBM bandwidth bound it to. Nothing here is a measured time: no autotuning happens ahead of
time, and XLA's cost model's "optimal_seconds" is not a measurement."""

import math
import re

import jax
from jax._src.lib import _jax  # XLA's HLO cost analysis for programs compiled for GPUs

from minilm_jax.kernels import attention
from minilm_jax.kernels.costs import FLOPS as PALLAS_KERNEL_FLOPS

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4}
_BYTES.update({"f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16})
_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# "%x = (f32[8,4]{1,0}, bf16[2]{0}) all-reduce(" or "%y = f32[8]{0} all-gather-done(": the result shape
# of a synchronous collective or of the "-done" half of an asynchronous one (its "-start" half
# holds the operands as well, and is not counted).
_COLLECTIVE_LINE = re.compile(r"=\s+(\(.*?\)|\S+)\s+(" + "|".join(_COLLECTIVES) + r")(-done)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")
CUDNN_ATTENTION = "__cudnn$fmha"
CUBLAS = "__cublas$"
# Custom calls that run a kernel XLA's cost models see as a black box (cuDNN's attention, cuBLAS's
# matrix products where XLA's GPU compiler leaves a product to it, Pallas kernels lowered to
# Triton, Mosaic GPU or Mosaic TPU): they count its FLOPs and bytes as nothing.
KERNEL_CALL_TARGETS = (CUDNN_ATTENTION, CUBLAS, "__gpu$xla.gpu.triton", "mosaic_gpu", "tpu_custom_call")
# Our Pallas kernels' FLOPs by the name they carry into the compiled program (`PALLAS_KERNEL_FLOPS`,
# `kernels.costs.FLOPS`): their matrix products from their operands' shapes.


def memory(compiled) -> dict:
  """Bytes per device: arguments, outputs, temporaries, and the peak they make together (outputs
  that alias donated arguments counted once)."""
  m = compiled.memory_analysis()
  peak = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  return {
    "argument_bytes_per_device": int(m.argument_size_in_bytes),
    "output_bytes_per_device": int(m.output_size_in_bytes),
    "alias_bytes_per_device": int(m.alias_size_in_bytes),
    "temp_bytes_per_device": int(m.temp_size_in_bytes),
    "peak_bytes_per_device": int(peak),
  }


def argument_bytes_per_device(args) -> int:
  """The bytes of a program's arguments on one device (abstract arrays with their shardings): a
  lower bound of its peak, known before compiling."""
  total = 0
  for a in jax.tree.leaves(args):
    shape = a.sharding.shard_shape(a.shape) if getattr(a, "sharding", None) is not None else a.shape
    total += math.prod(shape) * a.dtype.itemsize
  return total


# An array in an HLO message: its element type and shape, e.g. "bf16[17179869184,1152]".
_HLO_ARRAY = re.compile(r"\b(pred|f8e\w+|bf16|[suf]\d+)\[([\d,]+)\]")


def _hlo_itemsize(element: str) -> int:
  """An HLO element type's bytes from its bits ("bf16": 2, "f8e4m3fn": 1); "pred", which has none: 1."""
  bits = re.match(r"[a-z]+(\d+)", element)
  return max(1, int(bits.group(1)) // 8) if bits else 1


def largest_array_bytes(message: str) -> int:
  """The bytes of the largest array an XLA message names (0 where it names none)."""
  arrays = _HLO_ARRAY.findall(message)
  return max((math.prod(int(d) for d in dims.split(",")) * _hlo_itemsize(e) for e, dims in arrays), default=0)


def costs(compiled, platform: str) -> dict:
  """XLA's FLOPs and bytes accessed per device for one call. The GPU compiler gives no cost
  analysis, so its optimised module is analysed by the CPU client's HLO cost model, where custom
  calls (cuDNN's attention) count nothing: `attention_kernel` says when that happened."""
  if platform == "tpu":
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  else:
    module = compiled.runtime_executable().hlo_modules()[0]
    analysis = _jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
  return {"flops": float(analysis.get("flops", 0.0)), "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}


# "%name = bf16[8,512,384]{2,1,0} dot(%a, %b), lhs_contracting_dims={2}, ..." (operands by name: their
# shapes are on the lines that define them, fusion parameters included).
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w\-]+)\((.*?)\)(.*)$", re.M)


def _ints(dims: str) -> list:
  return [int(d) for d in dims.split(",") if d]


def _dims(shape: str) -> list:
  found = _ARRAY.match(shape)
  return _ints(found.group(2)) if found else []


def _taps(size: int, pad_low: int, input_size: int, output_size: int) -> float:
  """Window taps per output position that land on the input rather than on padding (stride 1),
  on average: XLA's TPU compiler writes some batched products as convolutions whose window spans
  the batch, padded by window - 1 on each side, where each output reads one tap of 32."""
  valid = sum(max(0, min(output_size, input_size + pad_low - t) - max(0, pad_low - t)) for t in range(size))
  return valid / output_size if output_size else 0.0


def _contracted(instruction: str, operands: str, attributes: str, shapes: dict, output: list) -> float:
  """How many products each output element of a dot or convolution sums (a convolution's: the
  lhs's feature dimension times the window's taps on the input)."""
  lhs = _dims(shapes.get(operands.split(",")[0].strip().lstrip("%"), ""))
  if instruction == "dot":
    found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attributes)
    return math.prod(lhs[int(d)] for d in found.group(1).split(",") if d) if found else 1
  labels = re.search(r"dim_labels=(\w+)_\w+->(\w+)", attributes)
  if not labels or not lhs:
    return 1
  lhs_labels, out_labels = labels.groups()
  taps = 1.0
  window = re.search(r"window=\{size=([\dx]+)(?: pad=([\d_x\-]+))?", attributes)
  if window:
    sizes = [int(w) for w in window.group(1).split("x")]
    pads = [int(p.split("_")[0]) for p in window.group(2).split("x")] if window.group(2) else [0] * len(sizes)
    for i, (size, pad) in enumerate(zip(sizes, pads)):
      taps *= _taps(size, pad, lhs[lhs_labels.index(str(i))], output[out_labels.index(str(i))])
  return lhs[lhs_labels.index("f")] * taps


def matmul_flops(hlo_text: str):
  """FLOPs of the optimised program's matrix products (its dots and convolutions, fused or not):
  2 x output elements x the products each sums, as XLA's cost model counts them. Set beside the
  analytic count, which counts only matrix products, this leaves out the elementwise work (softmax,
  normalisation, dropout's random bits, the optimizer) that XLA's total includes. A product in a
  loop's body is counted once, not once per iteration: the relation KLs' loop over query chunks
  (about 1.5 % of MiniLM's step at length 512, in 8 chunks) is mostly missed, which is why a
  distillation step's count comes out 1-2 % under the analytic one. None when the program has
  dilated convolutions (XLA's TPU compiler writes batched products so), which this does not count."""
  if "lhs_dilate=" in hlo_text or "rhs_dilate=" in hlo_text:
    return None
  shapes, total = {}, 0.0
  instructions = _INSTRUCTION.findall(hlo_text)
  for name, shape, _, _, _ in instructions:
    shapes[name] = shape
  for _, shape, instruction, operands, attributes in instructions:
    if instruction in ("dot", "convolution"):
      output = _dims(shape)
      total += 2.0 * math.prod(output) * _contracted(instruction, operands, attributes, shapes, output)
  return total


def _shape_bytes(shape: str) -> int:
  """Bytes of every array in `shape` (a tuple's elements summed)."""
  return sum(_BYTES.get(dtype, 4) * math.prod(_ints(dims)) for dtype, dims in _ARRAY.findall(shape))


def collective_bytes(hlo_text: str) -> dict:
  """Bytes each kind of collective produces per device per call, from the optimised HLO."""
  out: dict[str, int] = {}
  for shape, kind, _ in _COLLECTIVE_LINE.findall(hlo_text):
    out[kind] = out.get(kind, 0) + _shape_bytes(shape)
  return out


def attention_kernel(hlo_text: str, calls: list) -> dict:
  """Which kernels the program's attention runs (cuDNN's flash kernel, our Pallas flash kernel,
  XLA's fusions) and how many calls of each of cuDNN's and our kernels it makes."""
  cudnn = hlo_text.count(f'custom_call_target="{CUDNN_ATTENTION}')
  pallas: dict[str, int] = {}
  for c in calls:
    if c["kernel"]:
      pallas[c["kernel"]] = pallas.get(c["kernel"], 0) + 1
  flash = attention.FORWARD in pallas
  kinds = [kind for kind, present in (("cudnn_flash", cudnn), ("pallas_flash", flash)) if present]
  return {
    "attention_kernel": " + ".join(kinds) or "xla",
    "cudnn_attention_calls": cudnn,
    "pallas_kernel_calls": pallas,
  }


_CUDNN_CALL = re.compile(
  r'custom_call_target="__cudnn\$fmha(\w*)".*?operand_layout_constraints=\{\w+\[(\d+),(\d+),(\d+),(\d+)\]'
)


_CUSTOM_CALL = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (\(.*?\)|\S+) custom-call\((.*?)\), (.*)$", re.M)
_LAYOUT_CONSTRAINTS = re.compile(r"operand_layout_constraints=\{(.*?)\}(?:, \w+=|$)")


def kernel_calls(hlo_text: str) -> list:
  """Every custom call of the optimised program that runs a kernel (`KERNEL_CALL_TARGETS`):
  [{"target", "kernel" (our Pallas kernel's name, or ""), "operand_shapes", "bytes", "flops"}]. A
  call's bytes are its operands read and its results written once (a cuBLAS call's workspace
  aside): the least HBM traffic it can have (a kernel that reads a block twice moves more), added
  to XLA's count, which counts these calls as nothing, so that moving work into a kernel does not
  hide its traffic. `flops` are a cuBLAS product's (2 x its output's elements x the products each
  sums); cuDNN's and our kernels' are counted by `cudnn_attention_flops` and
  `pallas_kernel_flops`."""
  shapes = {name: shape for name, shape, _, _, _ in _INSTRUCTION.findall(hlo_text)}
  calls = []
  for result, operands, attributes in _CUSTOM_CALL.findall(hlo_text):
    target = re.search(r'custom_call_target="([^"]*)"', attributes)
    if not target or not target.group(1).startswith(KERNEL_CALL_TARGETS):
      continue
    constraints = _LAYOUT_CONSTRAINTS.search(attributes)
    if constraints:
      operand_shapes = [f"{t}[{d}]" for t, d in _ARRAY.findall(constraints.group(1))]
    else:
      names = [re.sub(r"/\*.*?\*/", "", o).strip().lstrip("%") for o in operands.split(",")]
      operand_shapes = [shapes.get(n, "") for n in names]
    kernel = max((k for k in PALLAS_KERNEL_FLOPS if k in attributes), key=len, default="")
    flops = 0.0
    if target.group(1).startswith(CUBLAS):
      product = _ARRAY.search(result)  # the product, not the workspace beside it
      result = product.group(0) if product else result
      contracting = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', attributes)
      lhs = _dims(operand_shapes[0]) if operand_shapes else []
      summed = math.prod(lhs[int(d.strip('" '))] for d in contracting.group(1).split(",") if d) if contracting else 1
      flops = 2.0 * math.prod(_dims(result)) * summed
    calls.append(
      {
        "target": target.group(1),
        "kernel": kernel,
        "operand_shapes": operand_shapes,
        "bytes": _shape_bytes(result) + sum(_shape_bytes(s) for s in operand_shapes),
        "flops": flops,
      }
    )
  return calls


def pallas_kernel_flops(calls: list) -> float:
  """FLOPs of our Pallas kernels' matrix products, from their operands' shapes (the cost models
  count the calls as nothing)."""
  return sum(PALLAS_KERNEL_FLOPS[c["kernel"]]([_dims(s) for s in c["operand_shapes"]]) for c in calls if c["kernel"])


def roofline(flops_per_device: float, bytes_per_device: float, chip) -> dict:
  """The least time a step can take on `chip`: its FLOPs at the peak bf16 rate or its bytes at
  the HBM bandwidth, whichever is longer, and which one that is."""
  compute_s, memory_s = flops_per_device / chip.peak_bf16_flops, bytes_per_device / chip.hbm_bytes_per_s
  return {"step_time_bound_s": max(compute_s, memory_s), "bound_by": "flops" if compute_s >= memory_s else "hbm"}


def cudnn_attention_flops(hlo_text: str) -> float:
  """FLOPs of the cuDNN attention calls, which the HLO cost model counts as nothing: per call on
  [B, L, H, K] queries (keys of the same length), the forward's two matrix products 4 B H L^2 K;
  the backward's five (the scores recomputed, then the gradients of values, probabilities,
  queries and keys) 10 B H L^2 K."""
  total = 0.0
  for call_target, b, length, heads, k in _CUDNN_CALL.findall(hlo_text):
    per_product = 2.0 * int(b) * int(heads) * int(length) ** 2 * int(k)
    total += per_product * (5 if "Backward" in call_target else 2)
  return total


def parse_hbm_oom(message: str):
  """The bytes a TPU program needed, from the compiler's CompileTimeHbmOom message, or None."""
  found = re.search(r"\(([\d.]+)([TGMK])\) exceeds available HBM", message) or re.search(
    r"[Uu]sed ([\d.]+)([TGMK]) of [\d.]+[TGMK] hbm", message
  )
  if not found:
    return None
  return float(found.group(1)) * {"T": 1 << 40, "G": 1 << 30, "M": 1 << 20, "K": 1 << 10}[found.group(2)]


# XLA's live-range dump: "  Live ranges at 123 (peak):" then "    <instruction>{<index>}: <n> bytes (cumulative: ...)".
_PEAK_HEADER = re.compile(r"^\s*Live ranges at \d+ \(peak\):\s*$")
_PEAK_BUFFER = re.compile(r"^\s+([\w.\-]+)\{[\d,]*\}: (\d+) bytes")
_OP_NAME = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*?metadata=\{[^}]*op_name="([^"]*)"', re.M)
_PARAMETER = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = \S+ parameter\(", re.M)


def _source(op_name: str) -> str:
  """An op's name as a reader groups it: transformations, every layer's number and a repeated scope
  dropped, so that a layer's buffers add up with the other layers' ("Encoder/layer_N/attention/...")."""
  parts = [p for p in op_name.split("/") if not p.startswith("jit(")]
  parts = [re.sub(r"^(?:transpose\()?(?:jvp\()?(.*?)\)*$", r"\1", p) for p in parts]
  parts = [re.sub(r"\blayers?_\d+", "layer_N", p) for p in parts if p]
  # Inside a rematerialised function JAX writes the scope again ("a/b/a/b/checkpoint/..."): once.
  for k in range(len(parts) // 2, 0, -1):
    if parts[:k] == parts[k : 2 * k]:
      parts = parts[k:]
      break
  return "/".join(parts) or op_name


def peak_buffers(live_range_text: str, hlo_text: str, top: int) -> list:
  """The buffers live at the program's peak (XLA's buffer assignment, dumped as live ranges),
  grouped by the operation that makes them: [{"source", "bytes", "buffers"}], largest first, the
  `top` largest and the rest as one row. Arguments (parameters, donated state included) are one
  group."""
  lines = live_range_text.splitlines()
  start = next((i for i, line in enumerate(lines) if _PEAK_HEADER.match(line)), None)
  if start is None:
    return []
  op_names = dict(_OP_NAME.findall(hlo_text))
  parameters = set(_PARAMETER.findall(hlo_text))
  groups: dict[str, tuple[int, int]] = {}
  for line in lines[start + 1 :]:
    found = _PEAK_BUFFER.match(line)
    if not found:
      break
    name, size = found.group(1), int(found.group(2))
    source = "arguments" if name in parameters else _source(op_names.get(name) or name)
    bytes_, count = groups.get(source, (0, 0))
    groups[source] = (bytes_ + size, count + 1)
  rows: list[dict] = [
    {"source": s, "bytes": b, "buffers": n} for s, (b, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])
  ]
  if len(rows) > top:
    rest = rows[top:]
    rows = rows[:top] + [
      {
        "source": f"the other {len(rest)} sources" if len(rest) > 1 else "the other source",
        "bytes": sum(r["bytes"] for r in rest),
        "buffers": sum(r["buffers"] for r in rest),
      }
    ]
  return rows
