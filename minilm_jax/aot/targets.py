"""Accelerator targets by name and their compile-only devices; their chips' facts are
`minilm_jax.devices.chips`'s table.

Names: a TPU slice as Google Cloud names it (`v4-8`, `v5p-8`: TensorCores, two per chip; `v5e-8`,
`v6e-8`: chips), optionally `x<slices>` for several slices (`v5e-256x2`); NVIDIA GPUs as
`h100x<gpus per host>[x<hosts>]` (`h100x8x2`: two hosts of eight).

TPU devices come from libtpu's topology description (`jax.experimental.topologies`), with the slice
shapes MaxText's `MaxText/accelerator_to_spec_map.py` uses; GPU devices from the CUDA PJRT plugin given a
target description of the chip (no driver needed). Both need the `aot` extra.
"""

import dataclasses
import os
import re

from jax.experimental import topologies

from minilm_jax.devices.chips import CHIPS, Chip
from minilm_jax.errors import UserError

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
