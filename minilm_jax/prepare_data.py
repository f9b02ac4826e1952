"""Tokenise and pack a distillation config's corpus once, for every process of every run to read:

  python -m minilm_jax.prepare_data --config configs/<experiment>.py --out <dir or gs://...> [--shards N]
      [--overwrite]

A local `--out` must be new (or empty; `--overwrite` replaces an earlier corpus) and is written
beside it, taking its name when complete; a remote one gets its manifest last.

Uses the config's teacher tokenizer, `data.corpus` (with `data.languages`: each language's, its
blocks counted in the manifest; the run samples them with its own `data.language_alpha`),
`data.max_seq_length` and `data.num_proc` (tokenisation workers). Then train with `--config.data.prepared=<dir>`.
"""

import contextlib
import sys
import tempfile

from absl import flags
from ml_collections import config_flags

from minilm_jax import runs
from minilm_jax.cli.outputs import check_new_directory, new_directory
from minilm_jax.cli.program import Program, run_program
from minilm_jax.data.languages import language_corpora, load_corpus
from minilm_jax.data.prepared import write_prepared
from minilm_jax.errors import UserError

PROGRAM = Program(kept_on_storage_error="nothing was written to --out")
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "The distillation config whose corpus to prepare.", lock_config=True, flag_values=PROGRAM.flag_values
)
_OUT = flags.DEFINE_string(
  "out", None, "The new prepared directory (local, or gs://... through etils.epath).", flag_values=PROGRAM.flag_values
)
_SHARDS = flags.DEFINE_integer(
  "shards",
  8,
  "Number of shard files (more for large corpora: each holds a slice of the blocks).",
  flag_values=PROGRAM.flag_values,
)
_OVERWRITE = flags.DEFINE_bool(
  "overwrite", False, "Replace the prepared corpus a local --out holds.", flag_values=PROGRAM.flag_values
)
flags.mark_flags_as_required(["config"], flag_values=PROGRAM.flag_values)


def _is_local(path: str) -> bool:
  return "://" not in path


def main(argv):
  del argv
  c = _CONFIG.value
  if not _OUT.value:
    raise UserError("name the directory to write: --out <dir>")
  if _SHARDS.value < 1:
    raise UserError(f"--shards={_SHARDS.value}: give at least 1")
  if c.data.prepared:
    raise UserError("the config already reads a prepared corpus (data.prepared): prepare from its data.corpus instead")
  corpora = language_corpora(c.data)
  files = [path for _, one in corpora for path in one.corpus.split(",")]
  inputs = [("the corpus file", path) for path in files] + [("the teacher", c.teacher.path)]
  if _is_local(_OUT.value):
    check_new_directory(_OUT.value, "--out", _OVERWRITE.value, inputs)
  elif _OVERWRITE.value:
    raise UserError(f"--overwrite is for a local --out: remove {_OUT.value} with your storage's tools first")
  tokenizer = runs.load_tokenizer_of(c.teacher.path, "teacher.path")
  destination = (
    new_directory(_OUT.value, "--out", _OVERWRITE.value, inputs)
    if _is_local(_OUT.value)
    else contextlib.nullcontext(_OUT.value)
  )
  with tempfile.TemporaryDirectory() as cache:  # the datasets cache of this one pass
    blocks = load_corpus(c.data, tokenizer, cache)
    sources = [c.data.corpus] + ([c.data.corpus_config] if c.data.corpus_config else [])
    sources += [f"languages {c.data.languages}"] if c.data.languages else []
    with destination as out:
      manifest = write_prepared(blocks, tokenizer, c.data.max_seq_length, out, _SHARDS.value, sources)
  print(
    f"wrote {manifest['blocks']} blocks ({manifest['tokens']} tokens) of {c.data.max_seq_length} in "
    f"{len(manifest['shards'])} shards to {_OUT.value}",
    file=sys.stderr,
  )


if __name__ == "__main__":
  run_program(main, PROGRAM)
