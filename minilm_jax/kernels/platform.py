"""Where a step is compiled for, and so which kernels and which Pallas lowering it takes."""

import dataclasses
import functools
import json
import os

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as plgpu

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
    """'64x4x2' (block, warps, stages) -> Tiling."""
    return cls(*(int(part) for part in spec.split("x")))


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
  """The tuned table at `path`: {key: entry with its "tiling" (BLOCKxWARPSxSTAGES), time and date}."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return json.load(f)


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
