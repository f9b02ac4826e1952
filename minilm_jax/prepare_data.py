"""Tokenise and pack a distillation config's corpus once, for every process of every run to read:

  python -m minilm_jax.prepare_data --config configs/<experiment>.py --out <dir or gs://...> [--shards N]

Uses the config's teacher tokenizer, `data.corpus`, `data.max_seq_length` and `data.num_proc`
(tokenisation workers). Then train with `--config.data.prepared=<dir>`.
"""

import sys
import tempfile

from absl import flags
from ml_collections import config_flags

from minilm_jax import runs
from minilm_jax.data.corpus import load_blocks
from minilm_jax.data.prepared import write_prepared
from minilm_jax.errors import UserError
from minilm_jax.program import run_program

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "The distillation config whose corpus to prepare.", lock_config=True
)
_OUT = flags.DEFINE_string("out", None, "The new prepared directory (local, or gs://... through etils.epath).")
_SHARDS = flags.DEFINE_integer(
  "shards", 8, "Number of shard files (more for large corpora: each holds a slice of the blocks)."
)
flags.mark_flags_as_required(["config"])


def main(argv):
  del argv
  c = _CONFIG.value
  if not _OUT.value:
    raise UserError("name the directory to write: --out <dir>")
  if _SHARDS.value < 1:
    raise UserError(f"--shards={_SHARDS.value}: give at least 1")
  if c.data.prepared:
    raise UserError("the config already reads a prepared corpus (data.prepared): prepare from its data.corpus instead")
  tokenizer = runs.load_tokenizer_of(c.teacher.path, "teacher.path")
  with tempfile.TemporaryDirectory() as cache:  # the datasets cache of this one pass
    blocks = load_blocks(c.data, tokenizer, cache)
    sources = [c.data.corpus] + ([c.data.corpus_config] if c.data.corpus_config else [])
    manifest = write_prepared(blocks, tokenizer, c.data.max_seq_length, _OUT.value, _SHARDS.value, sources)
  print(
    f"wrote {manifest['blocks']} blocks ({manifest['tokens']} tokens) of {c.data.max_seq_length} in "
    f"{len(manifest['shards'])} shards to {_OUT.value}",
    file=sys.stderr,
  )


if __name__ == "__main__":
  run_program(main)
