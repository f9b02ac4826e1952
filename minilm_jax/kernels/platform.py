"""Where a step is compiled for, and so which kernels and which Pallas lowering it takes."""

import dataclasses
import functools
import json
import os

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

from minilm_jax.errors import UserError

GPU_PLATFORMS = ("gpu", "cuda")


def compute_platform() -> str:
  """The platform the function being traced is compiled for: the devices of the mesh it is traced
  under (inside `shard_map`, or `parallel.traced_on_mesh` for `jit` with shardings), else the
  default backend. Compiling ahead of time on a CPU host for a GPU or TPU (`minilm_jax.aot`)
  therefore picks the kernels the accelerator will run, not the host's."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.abstract_device is not None:
    return mesh.abstract_device.platform
  return jax.default_backend()


def on_accelerator() -> bool:
  """Whether the function being traced is compiled for a GPU or TPU, where memory, not compute,
  limits the batch: rematerialisation pays there and is only cost on a CPU."""
  return compute_platform() != "cpu"


def kernel_platform() -> str | None:
  """The platform whose Pallas lowering the fused kernels take in the function being traced, or
  None for the explicit XLA path. GPUs and TPUs run the kernels (there the [B, H, L, L] tensors'
  HBM traffic and memory bound the step); CPUs keep the explicit path, where memory is not the
  limit and the kernels could only be interpreted (the tests call them with "cpu")."""
  platform = compute_platform()
  return platform if platform == "tpu" or platform in GPU_PLATFORMS else None


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How the kernels cut their work: query and key rows per block, and on GPUs the warps of a
  program and the software-pipeline stages of its loops."""

  block: int
  num_warps: int = 4
  num_stages: int = 2

  def block_for(self, length: int) -> int:
    """The block for a sequence `length`: `block` rows, or the whole length where it does not divide it."""
    return self.block if length % self.block == 0 else length

  @classmethod
  def parse(cls, spec: str) -> "Tiling":
    """'64x4x2' (block, warps, stages) -> Tiling; ValueError for anything else: a block and warps
    that are powers of two (8 rows up; 1 to 32 warps, as Triton takes them) and a stage or more."""
    parts = spec.split("x") if isinstance(spec, str) else []
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
      raise ValueError("write each as BLOCKxWARPSxSTAGES, e.g. 64x4x2")
    tiling = cls(*(int(p) for p in parts))
    power_of_two = lambda n: n > 0 and n & (n - 1) == 0
    block, warps, stages = tiling.block, tiling.num_warps, tiling.num_stages
    if not (block >= 8 and power_of_two(block) and power_of_two(warps) and warps <= 32 and stages >= 1):
      raise ValueError("a block is a power of two from 8 rows, warps a power of two from 1 to 32, stages 1 or more")
    return tiling


# TPUs: 128 rows fill the lanes. GPUs: 64-row blocks, whose [64, 64] float32 scores (and the dropout
# hash's integers) take 32 registers a thread at 4 warps; 128-row blocks spilled to local memory
# and ran both kernels slower than XLA's explicit path on an H100 (`python -m minilm_jax.bench kernels`,
# docs/results.md, "On an H100").
TILINGS = {"tpu": Tiling(128), "gpu": Tiling(64), "cuda": Tiling(64), "cpu": Tiling(128)}


# The tilings `bench kernels --tune` measured fastest, per chip, kernel, head sizes and length; a shape
# it has no entry for takes the platform's default (`TILINGS`).
TUNED_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuned_tilings.json")


def compute_device_kind() -> str:
  """The kind of device the function being traced is compiled for (`compute_platform`'s devices):
  "NVIDIA H100 80GB HBM3", "TPU v5 lite", "cpu"."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and mesh.abstract_device is not None:
    return mesh.abstract_device.device_kind
  return jax.devices()[0].device_kind


def tuned_key(device_kind: str, kernel: str, dims: tuple, length: int) -> str:
  """An entry's key in the tuned table: chip, kernel (its Pallas name), head sizes, length."""
  return f"{device_kind}|{kernel}|{'x'.join(str(d) for d in dims)}|{length}"


@functools.cache
def tuned_tilings(path: str) -> dict:
  """The tuned table at `path`: {key: entry with its "tiling" (BLOCKxWARPSxSTAGES), time and date}.
  One line naming the file where it is not such a table: every GPU and TPU step reads it."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      table = json.load(f)
    if not isinstance(table, dict):
      raise ValueError(f"it holds a JSON {type(table).__name__}, not an object of entries")
    for key, entry in table.items():
      if not isinstance(entry, dict) or not isinstance(entry.get("tiling"), str):
        raise ValueError(f"its entry {key!r} has no tiling")
      try:
        Tiling.parse(entry["tiling"])
      except ValueError as e:
        raise ValueError(f"its entry {key!r} has the tiling {entry['tiling']!r}: {e}") from None
  except (UnicodeDecodeError, ValueError) as e:  # json's errors are ValueErrors
    raise UserError(
      f"the tuned tilings {path} cannot be read ({e}): restore the file (git checkout, or reinstall the "
      f"package) or delete it and tune again (python -m minilm_jax.bench kernels --tune)"
    ) from None
  return table


def tiling_for(platform: str, kernel: str = "", dims: tuple = (), length: int = 0) -> Tiling:
  """The tiling `kernel` takes at head sizes `dims` and `length` on the chip being compiled for: the
  tuned table's, else the platform's default."""
  if kernel:
    entry = tuned_tilings(TUNED_TABLE).get(tuned_key(compute_device_kind(), kernel, dims, length))
    if entry:
      return Tiling.parse(entry["tiling"])
  return TILINGS.get(platform, TILINGS["cpu"])


def _compiler_params(platform: str, grid_rank: int, tiling: Tiling):
  """Lowering options: every grid axis independent (each program writes its own output block) on
  TPUs; warps and pipeline stages on GPUs; none when interpreting on a CPU."""
  if platform == "tpu":
    return pltpu.CompilerParams(dimension_semantics=[pltpu.PARALLEL] * grid_rank)
  if platform in GPU_PLATFORMS:
    return plgpu.CompilerParams(num_warps=tiling.num_warps, num_stages=tiling.num_stages)
  return None


def out_shape(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A kernel output's shape and dtype, varying over the mesh axes that `like` (an input) varies
  over: inside `shard_map` Pallas must be told how its outputs vary."""
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).mat)


def call(kernel, platform: str, name: str, tiling: Tiling, **kwargs):
  """`pl.pallas_call` for `platform`: compiled (Triton on GPUs, Mosaic on TPUs), or interpreted
  on a CPU. `name` is how the kernel appears in the compiled program (`aot.report` counts its
  traffic and FLOPs by it)."""
  return pl.pallas_call(
    kernel,
    interpret=platform not in ("tpu", *GPU_PLATFORMS),
    name=name,
    compiler_params=_compiler_params(platform, len(kwargs.get("grid", ())), tiling),
    **kwargs,
  )
