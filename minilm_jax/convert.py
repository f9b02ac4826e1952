"""Checkpoint conversion between our runs and Hugging Face directories.

  python -m minilm_jax.convert --from-hf <HF dir or hub name> --out <workdir>
  python -m minilm_jax.convert --to-hf --workdir <workdir> [--step N] [--sentence-transformers] --out <HF dir>
      [--overwrite]

`--out` must be new (or empty); `--overwrite` replaces an earlier export. The files are written
beside it and take its name when complete, so a failure leaves `--out` as it was.

`--to-hf` of a fine-tuned run writes BertForSequenceClassification / BertForQuestionAnswering;
`--sentence-transformers` adds the sentence-transformers pipeline of a distilled encoder.
"""

import sys

from absl import flags

from minilm_jax import runs
from minilm_jax.cli.outputs import new_directory
from minilm_jax.cli.program import Program, run_program
from minilm_jax.errors import StorageError, UserError, storage_failure

PROGRAM = Program(kept_on_storage_error="nothing was written to --out")
_FROM_HF = flags.DEFINE_string(
  "from-hf", None, "A Hugging Face directory (or hub name, online) to turn into a run.", flag_values=PROGRAM.flag_values
)
_TO_HF = flags.DEFINE_bool(
  "to-hf", False, "Export --workdir's checkpoint as a Hugging Face directory.", flag_values=PROGRAM.flag_values
)
_SENTENCE_TRANSFORMERS = flags.DEFINE_bool(
  "sentence-transformers",
  False,
  "With --to-hf: also the sentence-transformers "
  "files (pooling, Dense map, Normalize), loadable by SentenceTransformer(dir).",
  flag_values=PROGRAM.flag_values,
)
_WORKDIR = flags.DEFINE_string("workdir", None, "With --to-hf: the run to export.", flag_values=PROGRAM.flag_values)
_STEP = flags.DEFINE_integer(
  "step", None, "With --to-hf: the checkpoint step (default: the latest).", flag_values=PROGRAM.flag_values
)
_STUDENT = flags.DEFINE_string(
  "student", None, "With --to-hf of a family of students: the one to export, by name.", flag_values=PROGRAM.flag_values
)
_OUT = flags.DEFINE_string(
  "out",
  None,
  "Where to write: a new workdir (--from-hf) or a Hugging Face directory (--to-hf).",
  flag_values=PROGRAM.flag_values,
)
_OVERWRITE = flags.DEFINE_bool(
  "overwrite", False, "With --to-hf: replace what --out holds (an earlier export).", flag_values=PROGRAM.flag_values
)


def main(argv):
  del argv
  if bool(_FROM_HF.value) == _TO_HF.value or not _OUT.value:
    raise UserError("use either --from-hf <dir> --out <workdir> or --to-hf --workdir <workdir> --out <dir>")
  if _FROM_HF.value:
    if _SENTENCE_TRANSFORMERS.value or _OVERWRITE.value or _STUDENT.value:
      raise UserError("--sentence-transformers, --overwrite and --student go with --to-hf: they concern an export")
    # A run is never replaced: --from-hf has no --overwrite, so its refusal offers none.
    source = [("the Hugging Face folder", _FROM_HF.value)]
    try:
      with new_directory(_OUT.value, "--out", False, source, overwritable=False) as staging:
        runs.write_run_from_hf(_FROM_HF.value, staging)
    except (StorageError, OSError) as e:  # said as convert's, not as a training run's checkpoint or a hidden folder
      reason = e.reason if isinstance(e, StorageError) else storage_failure(e)
      if reason is None:
        raise
      raise UserError(
        f"--out {_OUT.value}: {reason} while writing the run converted from {_FROM_HF.value}: free space there "
        "(or make it writable) and rerun; nothing was written to --out"
      ) from None
    print(f"wrote run {_OUT.value} from {_FROM_HF.value}", file=sys.stderr)
    return
  if not _WORKDIR.value:
    raise UserError("--to-hf needs --workdir <run to export>")
  with new_directory(_OUT.value, "--out", _OVERWRITE.value, [("the run", _WORKDIR.value)]) as staging:
    config, head = runs.export_run(_WORKDIR.value, staging, _STEP.value, _SENTENCE_TRANSFORMERS.value, _STUDENT.value)
  kind = (
    "sentence-transformers encoder"
    if _SENTENCE_TRANSFORMERS.value
    else "encoder"
    if head is None
    else f"{head['kind']} model"
  )
  print(f"wrote {config.num_layers}x{config.hidden_size} {kind} to {_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  run_program(main, PROGRAM)
