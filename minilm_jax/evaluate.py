"""Batch evaluation: `python -m minilm_jax.evaluate --runs <workdir>[,<workdir>...] --out <dir>
[--all_steps] [--data_dir <dir>]`.

Writes `<out>/metrics.json` (one row per run, checkpoint and split), predictions, and GLUE
test-set submission files (`<out>/<run>/step_<n>/SST-2.tsv`, ...) when the data folder has test files.
"""

from absl import flags

from minilm_jax.benchmarks.table import format_table
from minilm_jax.errors import UserError, run_program
from minilm_jax.tasks.evaluation import evaluate_runs

_RUNS = flags.DEFINE_list("runs", None, "Fine-tuning workdirs to evaluate.")
_OUT = flags.DEFINE_string("out", None, "Directory for metrics.json, predictions and submission files.")
_ALL_STEPS = flags.DEFINE_bool("all_steps", False, "Evaluate every kept checkpoint, not only the latest.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "Override the data folder the runs were fine-tuned with.")
_BATCH = flags.DEFINE_integer("eval_batch_size", 128, "Global evaluation batch size.")
_MODEL = flags.DEFINE_integer("mesh_model", 1, "Devices each parameter matrix is split over.")


def main(argv):
  del argv
  if not _RUNS.value or not _OUT.value:
    raise UserError("name the runs and an output folder: --runs <workdir>[,<workdir>...] --out <dir>")
  from minilm_jax import parallel

  rows = evaluate_runs(_RUNS.value, _OUT.value, _ALL_STEPS.value, _DATA_DIR.value, _BATCH.value,
                       parallel.make_mesh(-1, _MODEL.value))
  print(format_table(rows))


if __name__ == "__main__":
  run_program(main)
