"""minilm_jax: knowledge distillation of Transformer encoders in JAX/Flax.

Importing the package starts JAX quietly. The `[aot]` extra installs jax's CUDA plugin and libtpu
into every environment that compiles for accelerators; where their hardware is absent, their
native code writes start-up failures to stderr (CUDA drivers not found, a plugin traceback,
libtpu's host bounds and worker hostnames), which a newcomer reads as a broken install. So:

- on a Linux host with no accelerator device (no NVIDIA, AMD or TPU device files), JAX runs on the
  CPU only (`JAX_PLATFORMS=cpu`, unless it is set): no plugin's backend is started;
- the native lines those plugins write while jax is imported and the plugins are registered are
  dropped; every other line written then reaches stderr as written. (`aot` asking libtpu or the
  CUDA plugin for a target's devices writes nothing.)
"""

import contextlib
import gc
import glob
import os
import re
import sys
import tempfile

__version__ = "0.1.0"

# `python -m minilm_jax.<program>` imports this package while it locates the program (sys.argv[0]
# is "-m" until then): the garbage collector stays off through the program's imports, which make
# some 400,000 objects that live as long as the process and which every full collection would walk
# again, and `end_of_imports` (the programs' `run_program`) puts them out of its sight and turns it
# back on. A library import (a notebook, the tests) leaves the collector alone.
_STARTED_AS_PROGRAM = sys.argv[:1] == ["-m"]
if _STARTED_AS_PROGRAM:
  gc.disable()


def end_of_imports():
  """A program's imports are done: what they made is frozen out of the garbage collector's sight
  (it walked them in every full collection: a fifth of a short program's time), then it is on."""
  if _STARTED_AS_PROGRAM and not gc.isenabled():
    gc.freeze()
    gc.enable()


# Device files of the accelerators JAX has plugins for on Linux: NVIDIA GPUs (and WSL2's GPU
# bridge), AMD GPUs (ROCm), TPUs (v2-v4 as /dev/accel*, v5e and later through VFIO).
_ACCELERATOR_DEVICES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd", "/dev/accel[0-9]*", "/dev/vfio/[0-9]*")

# What the plugins' native code writes when their hardware is absent (one pattern per line kind).
_PLUGIN_NOISE = re.compile(
  r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
  r"|WARNING: Logging before InitGoogle\(\) is written to STDERR"
  r"|I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\."
  r"|Failed to find host bounds for accelerator type: .*"
  r"|E\d{4} .*\] INVALID_ARGUMENT: Error: unexpected worker hostname .*"
  r"|=== Source Location Trace: ===|learning/\S+/libtpu_init_utils\.cc:\d+"
)


def _accelerator_present() -> bool:
  """Whether this host may have an accelerator: on Linux, one of its device files exists; elsewhere
  (macOS's Metal plugin has none) we cannot tell, so yes."""
  return not sys.platform.startswith("linux") or any(glob.glob(pattern) for pattern in _ACCELERATOR_DEVICES)


@contextlib.contextmanager
def _native_stderr_filtered():
  """Runs the block with file descriptor 2 (where native code writes) captured in a file, then
  writes what was captured to stderr without the plugins' start-up lines."""
  sys.stderr.flush()
  with tempfile.TemporaryFile() as capture:
    saved = os.dup(2)
    os.dup2(capture.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      capture.seek(0)
      lines = capture.read().decode(errors="replace").splitlines(keepends=True)
      sys.stderr.write("".join(line for line in lines if not _PLUGIN_NOISE.fullmatch(line.strip())))
      sys.stderr.flush()


def memory_fraction_readable() -> bool:
  """Whether XLA_PYTHON_CLIENT_MEM_FRACTION (the share of a GPU's memory JAX preallocates) is unset
  or a number in (0, 1]. The CUDA plugin reads it when it is registered and fails with a traceback
  otherwise; the programs refuse it in one line instead (`cli/program.py`)."""
  fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
  try:
    return fraction is None or 0 < float(fraction) <= 1
  except ValueError:
    return False


if "JAX_PLATFORMS" not in os.environ and not _accelerator_present():
  os.environ["JAX_PLATFORMS"] = "cpu"
with _native_stderr_filtered():
  import jax  # noqa: F401  (loads the CUDA plugin's libraries, when installed)
  from jax._src import xla_bridge

  # Imports and registers the installed plugins (what jax does at its first backend), starting none:
  # a multi-host run still calls jax.distributed.initialize before any backend exists. With a
  # memory share the CUDA plugin cannot read, jax registers them at its first backend instead.
  if memory_fraction_readable():
    xla_bridge._discover_and_register_pjrt_plugins()
