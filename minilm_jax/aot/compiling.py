"""Compiling a program for a chip that is not attached (`compile_program`), and telling a program
over the chip's memory (`DoesNotFit`) from a failure of the compiler: the `aot` program's core,
apart from its flags so that the tests can call it in process."""

import contextlib
import math
import os
import re
import sys
import tempfile
import time

import jax

from minilm_jax.aot import report


class DoesNotFit(Exception):
  """A program over the chip's memory: `needed` is the compiler's figure (NaN if unreadable), or with
  `at_least` a lower bound (its arguments' bytes alone)."""

  def __init__(self, needed: float, at_least: bool = False):
    super().__init__(f"needs {needed} bytes")
    self.needed, self.at_least = needed, at_least


# What the GPU compiler logs (from C++, to the process's stderr) for a program over the card:
# the report, or the one-line refusal, says the same.
_OVER_CAPACITY_LOG = re.compile(
  r"^[WE]\d{4} .*(hlo_rematerialization\.cc:\d+\] Can't reduce memory use below"
  r"|gpu_hlo_schedule\.cc:\d+\] The byte size of input/output arguments \(\d+\) exceeds the base limit)"
)
# How the GPU compiler fails on a program far past any card (its arrays' rows or its kernels' blocks
# beyond what it can index), not a fault of the program.
_TOO_LARGE_FOR_THE_GPU_COMPILER = ("Couldn't find output tile sizes", "launch needs more blocks")


@contextlib.contextmanager
def _without_over_capacity_log():
  """Holds back file descriptor 2 while XLA compiles, then passes on every line but those."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      held.seek(0)
      kept = [l for l in held.read().decode(errors="replace").splitlines(True) if not _OVER_CAPACITY_LOG.match(l)]
      sys.stderr.write("".join(kept))


def compile_program(program, target, dump_dir: str = "") -> tuple:
  """(compiled, seconds). DoesNotFit for a program over the chip's memory: one whose arguments alone
  pass it (before compiling), a TPU compile the compiler refuses, a GPU compile that fails on sizes
  past any card. With `dump_dir`, XLA writes its optimised module and buffer assignment there."""
  options = {"xla_dump_to": dump_dir, "xla_dump_hlo_as_text": True} if dump_dir else None
  # A batch whose inputs alone pass the chip's memory is refused before compiling: the GPU compiler
  # fails on such sizes with an internal error of its own (a product with more rows than it can tile,
  # a kernel launch of more blocks than the card allows), and a TPU compile of them takes minutes.
  arguments = report.argument_bytes_per_device(program.args)
  if arguments > target.usable_memory_bytes:
    raise DoesNotFit(arguments, at_least=True)
  start = time.perf_counter()
  try:
    with _without_over_capacity_log():
      compiled = program.step.lower(*program.args).compile(compiler_options=options)
  except jax.errors.JaxRuntimeError as e:
    message = str(e)
    if any(said in message for said in _TOO_LARGE_FOR_THE_GPU_COMPILER):
      raise DoesNotFit(max(arguments, report.largest_array_bytes(message)), at_least=True) from None
    if "RESOURCE_EXHAUSTED" not in message:
      raise
    needed = report.parse_hbm_oom(message)
    raise DoesNotFit(needed or math.nan) from None
  return compiled, time.perf_counter() - start
