"""Reading a run's workdir, a Hugging Face directory or (online) a hub name as a model, and making a
run of a Hugging Face encoder.

A workdir (of distillation, fine-tuning, task distillation or `convert --from-hf`) holds Orbax
checkpoints whose record (`RunRecord`) says what the run is, and the tokenizer in `tokenizer/`.
Params are the encoder's, or a task model's `{"encoder": ..., <head>: ...}`. Multi-task runs (a
refined teacher, a task student) keep a Transformer encoder, if they have one, under
`{"body": {"encoder": ...}}`.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections

from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.models import embeddings, hf, sharding
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.heads import abstract_model_params
from minilm_jax.models.students import make_student, refined_teacher, student_kind
from minilm_jax.runs.checkpoints import RunCheckpoints, is_run
from minilm_jax.runs.record import CONVERTED, RunRecord
from minilm_jax.tasks import get_task
from minilm_jax.tasks.inputs import dummy_batch

TOKENIZER_DIR = "tokenizer"


# Models named by the Hugging Face hub: a name that is not a local path is downloaded (online).
def _download(name: str) -> str:
  from huggingface_hub import snapshot_download

  try:
    return snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"])
  except Exception as e:  # offline, unknown repository, ...: the hub's exception types vary by version
    raise UserError(
      f"{name!r} is not a local directory and could not be fetched from the hub "
      f"({type(e).__name__}): pass a local Hugging Face directory or a run's workdir"
    ) from None


def local_dir(path: str, what: str = "model") -> str:
  """`path` when it exists; a hub name's downloaded snapshot (online); else one line naming `what`."""
  if os.path.exists(path):
    return path
  if not path or path.startswith((".", "/", "~")) or path.count("/") > 1:
    raise UserError(f"{what} {path} does not exist: pass a Hugging Face directory or a run's workdir")
  return _download(path)


def read_record(workdir: str, step: int | None = None) -> RunRecord:
  """What the run in `workdir` is (its record at `step`, default the newest readable)."""
  ckpt = RunCheckpoints(workdir, read_only=True)
  try:
    return ckpt.read_record(step)
  finally:
    ckpt.close()


def read_run(
  workdir: str,
  step: int | None = None,
  dtype: str = "float32",
  mesh=None,
  tokenizer: bool = True,
  sentence_pipeline: bool = False,
  student: str | None = None,
) -> hf.LoadedModel:
  """A run's checkpoint (latest, or `step`): its encoder config, task head (None for an encoder, and
  for a multi-task run, whose shared encoder alone is read), params and (unless `tokenizer` is
  False: more checkpoints of a run already read) its tokenizer, and its record; with
  `sentence_pipeline`, its sentence embeddings' pooling and Dense kernel (`sentence_pipeline`). The
  checkpoints are opened once. With `mesh`, the parameters are restored straight onto it, sharded by
  `parallel`'s rules. A family of students (`distill.family`) is read one `student` at a time:
  that student's record and parameters, as if it had been distilled alone."""
  ckpt = RunCheckpoints(workdir, read_only=True)
  try:
    record = ckpt.read_record(step)
    if student is not None and not record.students:
      raise UserError(f"--student {student}: {workdir} holds one student, not a family: leave --student out")
    under = (student,) if record.students else ()  # where the student's parameters are in the state
    if record.students and student is not None:  # without a name, `transformer` says which there are
      record = record.member(student, workdir)
    config = record.transformer(workdir).replace(dtype=dtype)
    head = None if record.multi_task else record.head
    abstract = abstract_model_params(config, head)
    if mesh is not None:
      abstract = parallel.placed(abstract, sharding.tree_shardings(abstract, mesh))
    if record.multi_task:  # only the encoder of {"body": {"encoder": ...}, "head_<task>": ...}
      params = ckpt.restore_params({"body": {"encoder": abstract}}, step)["body"]["encoder"]
    else:
      params = _restore_under(ckpt, abstract, step, under)
    pipeline = _sentence_pipeline(ckpt, record, step, under) if sentence_pipeline else None
  finally:
    ckpt.close()
  return hf.LoadedModel(
    config, params, load_tokenizer_of(workdir) if tokenizer else None, head, sentence_pipeline=pipeline, record=record
  )


def load_encoder(
  path: str, dtype: str = "float32", what: str = "model", mlm_head: bool = False, sentence_pipeline: bool = False
) -> hf.LoadedModel:
  """The encoder (config, encoder params, tokenizer) of a run's workdir, a Hugging Face directory, or
  (when online) a hub name; with `mlm_head`, a Hugging Face checkpoint's masked-LM head too, from
  the same read of its weights (runs and encoder-only checkpoints have none); with
  `sentence_pipeline`, a run's sentence-embedding pipeline from the same read (a Hugging Face
  directory's is in its files: `sentence_pipeline_of`). `what` names the path in errors
  ("teacher.path", "init", ...)."""
  if not path:
    raise UserError(f"{what} is empty: set it to a Hugging Face directory or a run's workdir")
  if is_run(path):
    run = read_run(path, dtype=dtype, sentence_pipeline=sentence_pipeline)
    encoder = run.params["encoder"] if run.head else run.params
    return hf.LoadedModel(run.config, encoder, run.tokenizer, sentence_pipeline=run.sentence_pipeline)
  path = local_dir(path, what)
  if not os.path.exists(os.path.join(path, "config.json")):
    raise UserError(
      f"{what} {path} is neither a run's workdir (no checkpoints/) nor a Hugging Face directory (no config.json)"
    )
  return hf.load(path, dtype, mlm_head)._replace(tokenizer=hf.load_tokenizer(path))


def encoder_config_of(path: str, what: str = "model") -> EncoderConfig:
  """The encoder architecture of a run's workdir or a Hugging Face directory, without reading its weights."""
  if is_run(path):
    return read_record(path).transformer(f"{what} {path}")
  return hf.read_config(local_dir(path, what))


def sentence_pipeline_of(path: str, default_length: int):
  """(pooling, Dense kernel or None) of a model's sentence embeddings: a run's (`_sentence_pipeline`),
  a sentence-transformers directory's, or mean pooling for a plain encoder."""
  if is_run(path):
    ckpt = RunCheckpoints(path, read_only=True)
    try:
      return _sentence_pipeline(ckpt, ckpt.read_record(), None)
    finally:
      ckpt.close()
  return embeddings.read_pipeline(local_dir(path), default_length)


def _restore_under(ckpt: RunCheckpoints, abstract, step: int | None, under: tuple):
  """The parameters `abstract` describes, found under the keys `under` of the saved parameters (a
  family's student's: `(name,)`; () for a run of one model)."""
  for key in reversed(under):
    abstract = {key: abstract}
  params = ckpt.restore_params(abstract, step)
  for key in under:
    params = params[key]
  return params


def _sentence_pipeline(ckpt: RunCheckpoints, record: RunRecord, step: int | None, under: tuple = ()):
  """A run's sentence embeddings: its teacher's pooling and the map to the teacher's width that the
  embedding objective learnt (mean pooling for other runs)."""
  embedding = record.sentence_embedding or {}
  config = record.encoder or EncoderConfig()
  pooling = embeddings.Pooling.from_dict({"max_seq_length": min(512, config.max_position_embeddings), **embedding})
  if not embedding.get("dense"):
    return pooling, None
  target = {"projection": {"embedding": {"kernel": jax.ShapeDtypeStruct(tuple(embedding["dense"]), jnp.float32)}}}
  return pooling, _restore_under(ckpt, target, step, under)["projection"]["embedding"]["kernel"]


def load_tokenizer_of(path: str, what: str = "model"):
  """The tokenizer of a run's workdir, of a Hugging Face directory or (online) of a hub name."""
  path = local_dir(path, what)
  return hf.load_tokenizer(os.path.join(path, TOKENIZER_DIR) if is_run(path) else path)


def save_tokenizer(workdir: str, tokenizer):
  """The run's tokenizer, beside its checkpoints (`load_tokenizer_of` reads it)."""
  tokenizer.save_pretrained(os.path.join(workdir, TOKENIZER_DIR))


def write_run_from_hf(hf_dir: str, workdir: str):
  """An Orbax run (step 0) holding a Hugging Face encoder: it can then start fine-tuning or teach."""
  config, params, tokenizer = load_encoder(hf_dir, what="--from-hf")[:3]
  ckpt = RunCheckpoints(workdir)
  if ckpt.latest_step() is not None:
    raise UserError(f"{workdir} already holds checkpoints: choose a new --out")
  ckpt.save(0, {"params": params}, {}, RunRecord(CONVERTED, config, source=os.path.abspath(hf_dir)))
  ckpt.wait()
  ckpt.close()
  save_tokenizer(workdir, tokenizer)


def read_multitask_run(workdir: str, mesh, step: int | None = None):
  """(model, params restored onto `mesh`, tokenizer, tasks, joint) of a multi-task run's checkpoint
  (latest, or `step`): a refined teacher, or a task student of any kind. `joint`: the model reads
  the `[CLS] a [SEP] b [SEP]` sequence (else each sentence on its own). The checkpoints are opened once."""
  ckpt = RunCheckpoints(workdir, read_only=True)
  try:
    record = ckpt.read_record(step)
    if record.task_student:
      student = ml_collections.ConfigDict(record.task_student_settings)
      model = make_student(student, record.heads, record.vocab_size, record.encoder)
      joint = student_kind(student.kind).joint
    else:
      model, joint = refined_teacher(record.transformer(workdir), record.heads), True
    tasks = [get_task(name) for name in record.tasks]
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy_batch(joint, tasks))["params"])
    abstract = parallel.placed(abstract, sharding.tree_shardings(abstract, mesh))
    params = ckpt.restore_params(abstract, step)
  finally:
    ckpt.close()
  return model, params, load_tokenizer_of(workdir), tasks, joint
