"""Batch evaluation.

  python -m minilm_jax.evaluate --runs <workdir>[,<workdir>...] --out <dir> [--all_steps] [--data_dir <dir>]
  python -m minilm_jax.evaluate --embeddings <run or model dir>[,...] --out <dir> [--sts <STS-B tsv>]

An `--out` that holds files is refused unless `--overwrite`, which replaces them only once the new
results are complete.

`--runs`: fine-tuning and task-distillation runs on their tasks. Writes `<out>/metrics.json` (one
row per run, checkpoint, task and split), predictions, and GLUE test-set submission files
(`<out>/<run>/step_<n>/SST-2.tsv`, ...) when the data folder has test files.
`--embeddings`: sentence embeddings of runs and Hugging Face / sentence-transformers directories,
by one protocol (WordNet retrieval, STS): `<out>/embeddings.json`.
"""

import contextlib

import jax
from absl import flags

from minilm_jax.cli import outputs
from minilm_jax.cli.program import Program, run_program
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.finetuned_runs import evaluate_runs
from minilm_jax.evaluation.sentences import evaluate_embeddings
from minilm_jax.reports.tables import format_table

PROGRAM = Program()
_RUNS = flags.DEFINE_list(
  "runs", None, "Workdirs of fine-tuning or task-distillation runs to evaluate.", flag_values=PROGRAM.flag_values
)
_EMBEDDINGS = flags.DEFINE_list(
  "embeddings",
  None,
  "Runs or Hugging Face / sentence-transformers directories whose sentence embeddings to evaluate.",
  flag_values=PROGRAM.flag_values,
)
_OUT = flags.DEFINE_string(
  "out", None, "Directory for metrics.json, predictions and submission files.", flag_values=PROGRAM.flag_values
)
_OVERWRITE = flags.DEFINE_bool(
  "overwrite",
  False,
  "Replace the results already in --out (once the new ones are complete).",
  flag_values=PROGRAM.flag_values,
)
_ALL_STEPS = flags.DEFINE_bool(
  "all_steps", False, "Evaluate every kept checkpoint, not only the latest.", flag_values=PROGRAM.flag_values
)
_DATA_DIR = flags.DEFINE_string(
  "data_dir",
  "",
  "Replace the runs' data folder (a multi-task run: one, or a comma list in its tasks' order).",
  flag_values=PROGRAM.flag_values,
)
_STS = flags.DEFINE_string(
  "sts",
  "",
  "--embeddings: an STS-B-format TSV (sentence1, sentence2, score) to score.",
  flag_values=PROGRAM.flag_values,
)
_WORDNET_DIR = flags.DEFINE_string(
  "wordnet_dir",
  "",
  "--embeddings: WordNet 3.0's dict folder (default: Debian's "
  "/usr/share/wordnet; minilm_jax/data/wordnet holds an excerpt).",
  flag_values=PROGRAM.flag_values,
)
_MAX_LEN = flags.DEFINE_integer(
  "max_seq_length", 128, "--embeddings: tokens per sentence, the same for every model.", flag_values=PROGRAM.flag_values
)
_BATCH = flags.DEFINE_integer("eval_batch_size", 128, "Global evaluation batch size.", flag_values=PROGRAM.flag_values)
_MODEL = flags.DEFINE_integer(
  "mesh_model", 1, "Devices each parameter matrix is split over.", flag_values=PROGRAM.flag_values
)


def main(argv):
  del argv
  if bool(_RUNS.value) == bool(_EMBEDDINGS.value) or not _OUT.value:
    raise UserError(
      "name the runs, or the models whose embeddings to evaluate, and an output folder: "
      "--runs <workdir>[,...] --out <dir>, or --embeddings <run or model dir>[,...] --out <dir>"
    )
  inputs = [("the run", run) for run in _RUNS.value or []] + [("the model", m) for m in _EMBEDDINGS.value or []]
  outputs.check_new_directory(_OUT.value, "--out", _OVERWRITE.value, inputs)  # before any work
  # Process 0 writes the results, into a hidden directory that becomes --out once they are complete.
  writing = jax.process_index() == 0
  destination = outputs.new_directory(_OUT.value, "--out", _OVERWRITE.value, inputs)
  with destination if writing else contextlib.nullcontext() as out:
    if _EMBEDDINGS.value:
      rows = evaluate_embeddings(
        _EMBEDDINGS.value,
        out,
        _STS.value,
        _WORDNET_DIR.value,
        _BATCH.value,
        _MAX_LEN.value,
        parallel.make_mesh(-1, 1),
      )
    else:
      rows = evaluate_runs(
        _RUNS.value, out, _ALL_STEPS.value, _DATA_DIR.value, _BATCH.value, parallel.make_mesh(-1, _MODEL.value)
      )
  print(format_table(rows))


if __name__ == "__main__":
  run_program(main, PROGRAM)
