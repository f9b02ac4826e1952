"""A run's checkpoint as a Hugging Face directory (`python -m minilm_jax.convert`), optionally a
sentence-transformers one."""

import json
import os
import sys

import jax
import numpy as np
from flax import traverse_util

from minilm_jax.errors import UserError
from minilm_jax.models import embeddings, hf
from minilm_jax.models.heads import head_kind, masked_targets
from minilm_jax.runs.checkpoints import is_run
from minilm_jax.runs.reading import read_run


def export_run(
  workdir: str, out_dir: str, step: int | None = None, sentence_transformers: bool = False, student: str | None = None
):
  """A run's checkpoint as a Hugging Face directory (with its task head, if it has one); with
  `sentence_transformers`, also the files that make it a `SentenceTransformer` computing the
  embeddings the run was distilled for (its teacher's pooling, the learned Dense map if any); of a
  family of students, the one named `student`. Parameters the run's objective never trained are
  named in a warning."""
  if not is_run(workdir):
    raise UserError(
      f"{workdir} is not a run's workdir (no checkpoints/): pass the --workdir of a train or finetune run"
    )
  run = read_run(workdir, step, sentence_pipeline=sentence_transformers, student=student)  # one opening
  config, params, tokenizer, head, record = run.config, run.params, run.tokenizer, run.head, run.record
  if sentence_transformers and head is not None:
    raise UserError(
      f"{workdir} is a fine-tuned {head['kind']} model, not a sentence encoder: export it without "
      f"--sentence-transformers, or export the distilled run it started from"
    )
  flat = traverse_util.flatten_dict(jax.device_get(params), sep="/")
  broken = [name for name, x in flat.items() if not np.isfinite(np.asarray(x)).all()]
  if broken:
    raise UserError(
      f"the checkpoint of {workdir} holds non-finite parameters ({len(broken)} of {len(flat)}, e.g. "
      f"{broken[0]}): export an earlier --step, or retrain with a lower learning rate"
    )
  hf.save(out_dir, config, params, tokenizer, head)
  if head is not None and head_kind(head).generates:
    _write_seq2seq_layout(out_dir, record.config, head)
  if sentence_transformers:
    assert run.sentence_pipeline is not None  # read_run gives it when asked, as it was above
    embeddings.save_sentence_transformers(out_dir, *run.sentence_pipeline, width=config.hidden_size)
  if record.untrained:
    print(
      f"warning: {len(record.untrained)} parameters never received a gradient under "
      f"loss.objective={record.objective} and are exported as initialised: {', '.join(record.untrained)} "
      f"(the embedding objective, loss.embedding_weight > 0, "
      f"trains every layer)",
      file=sys.stderr,
    )
  return config, head


def _write_seq2seq_layout(out_dir: str, config: dict, head: dict):
  """`seq2seq.json` beside an exported sequence-to-sequence model: the input layout and the
  attention mask it was trained with, which transformers' BertForMaskedLM does not build itself."""
  total, target = config["max_seq_length"], head["target_length"]
  layout = {
    "total_length": total,
    "source_length": total - target,
    "target_length": target,
    "input": "[CLS] source [SEP] padded to source_length, then the target's tokens padded to target_length; "
    "token_type_ids 0 for the source block, 1 for the target block",
    "position_ids": "the real tokens numbered 0, 1, ... consecutively, skipping the source block's padding",
    "attention_mask": "a [batch, 1, total, total] boolean mask: a source token sees the real source tokens; a target "
    "token sees the real source tokens and the real target tokens up to itself "
    "(minilm_jax.models.heads.seq2seq_mask)",
    "prediction": (
      "UniLM's masked targets: the target block holds the tokens chosen so far and a [MASK] after them; the "
      "[MASK]'s output predicts the next token, which then replaces it; [SEP] ends the output"
      if masked_targets(head)
      else "the first target token from the source's last real token ([SEP]), each next token from the one "
      "before it; [SEP] ends the output"
    ),
    "decoding": {
      k: config["seq2seq"][k] for k in ("beam_size", "length_penalty", "min_target_length", "no_repeat_ngram")
    },
  }
  with open(os.path.join(out_dir, "seq2seq.json"), "w") as f:
    json.dump(layout, f, indent=2)
