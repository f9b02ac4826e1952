"""Accelerator targets by name, their chips' facts, and their compile-only devices.

Names: a TPU slice as Google Cloud names it (`v4-8`, `v5p-8`: TensorCores, two per chip; `v5e-8`,
`v6e-8`: chips), optionally `x<slices>` for several slices (`v5e-256x2`); NVIDIA GPUs as
`h100x<gpus per host>[x<hosts>]` (`h100x8x2`: two hosts of eight).

TPU devices come from libtpu's topology description (`jax.experimental.topologies`), with the slice
shapes MaxText's `accelerator_to_spec_map.py` uses; GPU devices from the CUDA PJRT plugin given a
target description of the chip (no driver needed). Both need the `aot` extra.
"""

import dataclasses
import os
import re

from jax.experimental import topologies

from minilm_jax.errors import UserError

GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip as JAX sees it (one device per chip: v4 and v5p run as megacore), and how
  targets of it are named: a TPU slice `<name>-<count>[x<slices>]`, counting chips or TensorCores
  (`cores_per_chip`); GPU hosts `<name>x<gpus per host>[x<hosts>]`. A row of `CHIPS` is all a new
  chip of a known platform needs: `parse_target`, `examples` and aot's help read the table."""

  platform: str  # "tpu" or "cuda"
  topology_prefix: str  # libtpu's generation name in topology strings ("v5e:2x2"); GPUs: unused
  memory_bytes: int  # high-bandwidth memory per chip
  peak_bf16_flops: float  # dense bfloat16 FLOP/s per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  source: str  # where the three numbers come from
  examples: tuple  # target names listed in aot's help and in errors
  grid: int = 2  # TPU slices: 2-D (v5e, v6e) or 3-D (v4, v5p) chip grids (`_GRIDS`)
  cores_per_chip: int = 1  # TPU names count TensorCores: 2 on v4 and v5p (one megacore device per chip)
  gpus_per_host: int = 8  # GPU hosts: at most this many per host
  target_config: str = ""  # GPUs: the chip as XLA's GPU compiler describes it (GpuTargetConfigProto text)


# Chips -> slice shape. 2-D slices (v5e, v6e) and 3-D slices (v4, v5p), as Google Cloud shapes them.
_GRIDS = {
  2: {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"},
  3: {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
  },
}

# An H100 SXM5 as XLA's GPU compiler describes it (its GpuTargetConfigProto; XLA keeps the full
# spec as xla/backends/gpu/target_config/specs/h100_sxm.txtpb). The compiler reads the compute
# capability, the cores, shared memory and the cuDNN/CUDA versions it may use from it.
H100_TARGET_CONFIG = """
gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 85520809984
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 8 }
runtime_version { major: 12 minor: 8 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""

_TPU_DOCS = "cloud.google.com/tpu/docs/"
CHIPS = {
  "v4": Chip(
    "tpu",
    "v4",
    32 * GiB,
    275e12,
    1200e9,
    _TPU_DOCS + "v4: 32 GiB HBM2, 275 TFLOP/s bf16, 1,200 GB/s per chip",
    ("v4-8",),
    grid=3,
    cores_per_chip=2,
  ),
  "v5p": Chip(
    "tpu",
    "v5",
    95 * GiB,
    459e12,
    2765e9,
    _TPU_DOCS + "v5p: 95 GiB HBM2e, 459 TFLOP/s bf16, 2,765 GB/s per chip",
    ("v5p-8",),
    grid=3,
    cores_per_chip=2,
  ),
  "v5e": Chip(
    "tpu",
    "v5e",
    16 * GiB,
    197e12,
    819e9,
    _TPU_DOCS + "v5e: 16 GiB HBM2, 197 TFLOP/s bf16, 819 GB/s per chip",
    ("v5e-8", "v5e-256", "v5e-256x2"),
  ),
  "v6e": Chip(
    "tpu",
    "v6e",
    32 * GiB,
    918e12,
    1640e9,
    _TPU_DOCS + "v6e: 32 GiB HBM, 918 TFLOP/s bf16, 1,640 GB/s per chip",
    ("v6e-8",),
  ),
  # 81,559 MiB is what CUDA reports for the 80 GB part; 989 TFLOP/s is the datasheet's dense bf16,
  # 3.35 TB/s its HBM3 bandwidth (the target description says the same to the compiler).
  "h100": Chip(
    "cuda",
    "",
    81559 << 20,
    989.4e12,
    3.35e12,
    "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 989 TFLOP/s dense bf16, 3.35 TB/s",
    ("h100x1", "h100x8", "h100x8x2"),
    target_config=H100_TARGET_CONFIG,
  ),
}


# JAX preallocates this fraction of a GPU's memory and allocates from it (XLA_PYTHON_CLIENT_MEM_FRACTION).
DEFAULT_GPU_MEMORY_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class Target:
  name: str
  chip: Chip
  num_devices: int  # over all slices or hosts
  topology: str  # TPU: "v5e:2x4"; GPU: "slices x hosts x gpus"
  chips_per_host_bounds: tuple = ()
  num_slices: int = 1

  @property
  def usable_memory_bytes(self) -> int:
    """What one device's program may use: a TPU's whole HBM (its compiler checks); on a GPU the
    share JAX preallocates (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set)."""
    if self.chip.platform == "tpu":
      return self.chip.memory_bytes
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_GPU_MEMORY_FRACTION))
    return int(self.chip.memory_bytes * fraction)


def examples() -> tuple:
  """Target names of every chip of `CHIPS`, for help and errors."""
  return tuple(name for chip in CHIPS.values() for name in chip.examples)


def _tpu_target(name: str, chip: Chip, count: int, slices: int) -> Target | None:
  chips = count // chip.cores_per_chip
  shape = _GRIDS[chip.grid].get(chips)
  if shape is None or slices < 1 or count % chip.cores_per_chip:
    return None
  bounds = (2, 4, 1) if chips == 8 and chip.grid == 2 else (1, 1, 1) if chips == 1 else (2, 2, 1)
  return Target(name, chip, chips * slices, f"{chip.topology_prefix}:{shape}", bounds, slices)


def _gpu_target(name: str, chip: Chip, per_host: int, hosts: int) -> Target | None:
  if not (1 <= per_host <= chip.gpus_per_host and hosts >= 1):
    return None
  return Target(name, chip, per_host * hosts, f"1x{hosts}x{per_host}")


def parse_target(name: str) -> Target:
  """The target a name stands for (the forms of `Chip`); an unknown name is one line listing the
  known forms."""
  for chip_name, chip in CHIPS.items():
    separator = "-" if chip.platform == "tpu" else "x"
    match = re.fullmatch(rf"{re.escape(chip_name)}{separator}(\d+)(?:x(\d+))?", name)
    if match:
      count, repeats = int(match.group(1)), int(match.group(2) or 1)
      build = _tpu_target if chip.platform == "tpu" else _gpu_target
      target = build(name, chip, count, repeats)
      if target is not None:
        return target
  forms = []
  for chip_name, chip in CHIPS.items():
    if chip.platform == "tpu":
      counts = ", ".join(str(n * chip.cores_per_chip) for n in sorted(_GRIDS[chip.grid]))
      unit = "TensorCores" if chip.cores_per_chip > 1 else "chips"
      forms.append(f"{chip_name}-N[x<slices>] (N {unit}: {counts})")
    else:
      forms.append(f"{chip_name}x<1-{chip.gpus_per_host}>[x<hosts>]")
  raise UserError(f"unknown target {name!r}: use one of {', '.join(examples())}, or {'; '.join(forms)}")


# libtpu looks for a TPU VM's metadata and worker addresses when it loads, and takes a lockfile so
# that one process owns the chips; a CPU host has no chips to own, and compiles in many processes.
_TPU_COMPILE_HOST_ENV = {
  "TPU_SKIP_MDS_QUERY": "1",
  "TPU_WORKER_HOSTNAMES": "localhost",
  "TPU_ACCELERATOR_TYPE": "v5litepod-1",
  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def compile_devices(target: Target) -> list:
  """The target's devices, compile-only: a mesh built from them lowers and compiles for the chips.
  Needs `pip install -e ".[aot]"` (libtpu; jax's CUDA PJRT plugin and cuDNN)."""
  if target.chip.platform == "tpu":
    for key, value in _TPU_COMPILE_HOST_ENV.items():
      os.environ.setdefault(key, value)
  try:
    if target.chip.platform == "tpu":
      return topologies.get_topology_desc(
        platform="tpu",
        topology_name=target.topology,
        chip_config_name="megacore" if target.chip.cores_per_chip > 1 else "default",
        chips_per_host_bounds=target.chips_per_host_bounds,
        num_slices=target.num_slices,
      ).devices
    return topologies.get_topology_desc(
      platform="cuda", topology=target.topology, target_config=target.chip.target_config
    ).devices
  except (RuntimeError, NotImplementedError) as e:
    what = "libtpu" if target.chip.platform == "tpu" else "jax's CUDA PJRT plugin"
    raise UserError(
      f"cannot make {target.name}'s devices ({what} missing or failing: {' '.join(str(e).split())[:160]}): "
      f'pip install -e ".[aot]" in this environment'
    ) from None
