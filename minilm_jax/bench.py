"""Benchmarks: `python -m minilm_jax.bench <distill|inference|memory|etd|task_distill> [--json FILE] [--repeats N] [--dtype D]`.

Each suite prints a table and, with --json, writes its rows as a JSON list. Times are medians after
a warm-up (compilation) call; every comparison is a ratio against a reference run in the same command.
"""

import json

from absl import flags

from minilm_jax.benchmarks import distill, etd, inference, memory, task_distill
from minilm_jax.benchmarks.table import format_table
from minilm_jax.errors import UserError, run_program

SUITES = {
    "distill": lambda: distill.run(_REPEATS.value, _DTYPE.value),
    "inference": lambda: inference.run(_REPEATS.value, _DTYPE.value),
    "memory": lambda: memory.run(),
    "etd": lambda: etd.run(_STEPS.value),
    "task_distill": lambda: task_distill.run(epochs=_EPOCHS.value),
}
_JSON = flags.DEFINE_string("json", None, "Also write the rows as a JSON list to this file.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats per measurement (after one warm-up).")
_STEPS = flags.DEFINE_integer("steps", 20, "etd: distillation steps after the starting loss.")
_EPOCHS = flags.DEFINE_integer("epochs", 3, "task_distill: epochs of the augmented student (the others get as many steps).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype (bfloat16 on accelerators).")


def main(argv):
  if len(argv) != 2 or argv[1] not in SUITES:
    raise UserError(f"name one suite: python -m minilm_jax.bench <{'|'.join(SUITES)}> [--json FILE]")
  rows = SUITES[argv[1]]()
  print(format_table(rows))
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  run_program(main)
