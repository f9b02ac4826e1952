"""A run's workdir as a model, and conversion between runs and Hugging Face directories.

A workdir (of distillation, fine-tuning, or `convert --from-hf`) holds Orbax checkpoints whose
`meta` names the encoder architecture (`encoder`) and, for fine-tuned models, the task head
(`head`), plus the tokenizer in `tokenizer/`. Params are the encoder's, or a task model's
`{"encoder": ..., <head>: ...}`. Multi-task runs (`meta["model"]`: a refined teacher, or a task
student) keep a Transformer encoder, if they have one, under `{"body": {"encoder": ...}}`.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from minilm_jax import checkpoint, embeddings, hf, hub, parallel
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.heads import SEQ2SEQ, abstract_model_params

TOKENIZER_DIR = "tokenizer"
REFINED_TEACHER, STUDENT = "refined_teacher", "student"  # meta["model"] of the multi-task runs


def read_meta(workdir: str, step: int = None) -> dict:
  ckpt = checkpoint.RunCheckpoints(workdir, read_only=True)
  try:
    return ckpt.read_meta(step)
  finally:
    ckpt.close()


def read_run(
  workdir: str, step: int = None, dtype: str = "float32", mesh=None, tokenizer: bool = True
) -> hf.LoadedModel:
  """A run's checkpoint (latest, or `step`): its encoder config, task head (None for an encoder, and
  for a multi-task run, whose shared encoder alone is read), params and (unless `tokenizer` is
  False: more checkpoints of a run already read) its tokenizer. With `mesh`, the parameters are
  restored straight onto it, sharded by `parallel`'s rules."""
  ckpt = checkpoint.RunCheckpoints(workdir, read_only=True)
  try:
    meta = ckpt.read_meta(step)
    if "encoder" not in meta:
      raise UserError(
        f"{workdir} holds a {meta.get('student', {}).get('kind')} student, which has no Transformer "
        f"encoder to load or export: its dev metrics are in results.json"
      )
    config = EncoderConfig.from_dict({**meta["encoder"], "dtype": dtype})
    multi_task = meta.get("model") in (REFINED_TEACHER, STUDENT)
    head = None if multi_task else meta.get("head")
    abstract = abstract_model_params(config, head)
    if mesh is not None:
      abstract = parallel.placed(abstract, parallel.tree_shardings(abstract, mesh))
    if multi_task:  # only the encoder of {"body": {"encoder": ...}, "head_<task>": ...}
      params = ckpt.restore_params({"body": {"encoder": abstract}}, step)["body"]["encoder"]
    else:
      params = ckpt.restore_params(abstract, step)
  finally:
    ckpt.close()
  return hf.LoadedModel(config, params, load_tokenizer_of(workdir) if tokenizer else None, head)


def load_encoder(path: str, dtype: str = "float32", what: str = "model", mlm_head: bool = False) -> hf.LoadedModel:
  """The encoder (config, encoder params, tokenizer) of a run's workdir, a Hugging Face directory, or
  (when online) a hub name; with `mlm_head`, a Hugging Face checkpoint's masked-LM head too, from
  the same read of its weights (runs and encoder-only checkpoints have none). `what` names the
  path in errors ("teacher.path", "init", ...)."""
  if not path:
    raise UserError(f"{what} is empty: set it to a Hugging Face directory or a run's workdir")
  if checkpoint.is_run(path):
    run = read_run(path, dtype=dtype)
    return hf.LoadedModel(run.config, run.params["encoder"] if run.head else run.params, run.tokenizer)
  path = hub.local_dir(path, what)
  if not os.path.exists(os.path.join(path, "config.json")):
    raise UserError(
      f"{what} {path} is neither a run's workdir (no checkpoints/) nor a Hugging Face directory (no config.json)"
    )
  return hf.load(path, dtype, mlm_head)._replace(tokenizer=hf.load_tokenizer(path))


def encoder_config_of(path: str, what: str = "model") -> EncoderConfig:
  """The encoder architecture of a run's workdir or a Hugging Face directory, without reading its weights."""
  if checkpoint.is_run(path):
    meta = read_meta(path)
    if "encoder" not in meta:
      raise UserError(
        f"{what} {path} holds a {meta.get('student', {}).get('kind')} student, which has no Transformer encoder"
      )
    return EncoderConfig.from_dict(meta["encoder"])
  return hf.read_config(hub.local_dir(path, what))


def sentence_pipeline_of(path: str, default_length: int):
  """(pooling, Dense kernel or None) of a model's sentence embeddings: a run's (`sentence_pipeline`),
  a sentence-transformers directory's, or mean pooling for a plain encoder."""
  if checkpoint.is_run(path):
    meta = read_meta(path)
    config = EncoderConfig.from_dict(meta["encoder"]) if "encoder" in meta else EncoderConfig()
    return sentence_pipeline(path, meta, config)
  return embeddings.read_pipeline(hub.local_dir(path), default_length)


def load_tokenizer_of(path: str, what: str = "model"):
  """The tokenizer of a run's workdir, of a Hugging Face directory or (online) of a hub name."""
  path = hub.local_dir(path, what)
  return hf.load_tokenizer(os.path.join(path, TOKENIZER_DIR) if checkpoint.is_run(path) else path)


def save_tokenizer(workdir: str, tokenizer):
  """The run's tokenizer, beside its checkpoints (`load_tokenizer_of` reads it)."""
  tokenizer.save_pretrained(os.path.join(workdir, TOKENIZER_DIR))


def write_run_from_hf(hf_dir: str, workdir: str):
  """An Orbax run (step 0) holding a Hugging Face encoder: it can then start fine-tuning or teach."""
  config, params, tokenizer = load_encoder(hf_dir, what="--from-hf")[:3]
  ckpt = checkpoint.RunCheckpoints(workdir)
  if ckpt.latest_step() is not None:
    raise UserError(f"{workdir} already holds checkpoints: choose a new --out")
  ckpt.save(0, {"params": params}, {}, {"encoder": config.to_dict(), "source": os.path.abspath(hf_dir)})
  ckpt.wait()
  ckpt.close()
  save_tokenizer(workdir, tokenizer)


def sentence_pipeline(workdir: str, meta: dict, config: EncoderConfig, step: int = None):
  """(pooling, Dense kernel or None) of a run's sentence embeddings: its teacher's pooling and the
  map to the teacher's width that the embedding objective learnt (mean pooling for other runs)."""
  embedding = meta.get("sentence_embedding", {})
  pooling = embeddings.Pooling.from_dict({"max_seq_length": min(512, config.max_position_embeddings), **embedding})
  if not embedding.get("dense"):
    return pooling, None
  ckpt = checkpoint.RunCheckpoints(workdir, read_only=True)
  try:
    target = {"projection": {"embedding": {"kernel": jax.ShapeDtypeStruct(tuple(embedding["dense"]), jnp.float32)}}}
    return pooling, ckpt.restore_params(target, step)["projection"]["embedding"]["kernel"]
  finally:
    ckpt.close()


def export_run(workdir: str, out_dir: str, step: int = None, sentence_transformers: bool = False):
  """A run's checkpoint as a Hugging Face directory (with its task head, if it has one); with
  `sentence_transformers`, also the files that make it a `SentenceTransformer` computing the
  embeddings the run was distilled for (its teacher's pooling, the learned Dense map if any).
  Parameters the run's objective never trained are named in a warning."""
  if not checkpoint.is_run(workdir):
    raise UserError(
      f"{workdir} is not a run's workdir (no checkpoints/): pass the --workdir of a train or finetune run"
    )
  config, params, tokenizer, head = read_run(workdir, step)[:4]
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
  meta = read_meta(workdir, step)
  hf.save(out_dir, config, params, tokenizer, head)
  if head is not None and head["kind"] == SEQ2SEQ:
    _write_seq2seq_layout(out_dir, meta["config"], head)
  if sentence_transformers:
    embeddings.save_sentence_transformers(
      out_dir, *sentence_pipeline(workdir, meta, config, step), width=config.hidden_size
    )
  untrained = meta.get("untrained") or []
  if untrained:
    objective = meta.get("config", {}).get("loss", {}).get("objective")
    print(
      f"warning: {len(untrained)} parameters never received a gradient under loss.objective={objective} and are "
      f"exported as initialised: {', '.join(untrained)} (the embedding objective, loss.embedding_weight > 0, "
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
      if head.get("masked_targets")
      else "the first target token from the source's last real token ([SEP]), each next token from the one "
      "before it; [SEP] ends the output"
    ),
    "decoding": {
      k: config["seq2seq"][k] for k in ("beam_size", "length_penalty", "min_target_length", "no_repeat_ngram")
    },
  }
  with open(os.path.join(out_dir, "seq2seq.json"), "w") as f:
    json.dump(layout, f, indent=2)
