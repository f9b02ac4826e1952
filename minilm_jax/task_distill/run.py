"""Task-specific and multi-task distillation (the thesis): a fine-tuned teacher's logits on the
(augmented) training set, learnt by a small student (BiLSTM, bi-attentive LSTM, 3-layer Transformer).

One trainer for both settings (`multitask.assemble_multitask_run`): a student is a body shared by its tasks
plus one head per task (thesis section 4.2); with one task it is chapter 3's distilled BiLSTM, with
several it is MKD (algorithm 1). Teachers are fine-tuning runs of each task or a multi-task refined
teacher. Their logits are computed once per training set, batched through the jitted teacher, and
cached on disk.
"""

import copy
import dataclasses
import hashlib
import json
import os
from functools import partial
from typing import Any

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import optax

from minilm_jax import runs
from minilm_jax.cli.outputs import write_json
from minilm_jax.data import augment, word_vectors
from minilm_jax.data.files import file_digest
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.finetuning.multitask import MultiTaskRun, MultiTaskSpec, assemble_multitask_run
from minilm_jax.finetuning.teachers import find_teachers, teacher_logits, teacher_paths
from minilm_jax.models import layout
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.students import make_student, student_kind
from minilm_jax.runs import lock
from minilm_jax.runs.reading import read_multitask_run
from minilm_jax.runs.record import TASK_STUDENT, RunRecord, check_same_inputs, check_same_teacher
from minilm_jax.task_distill import config as task_distill_config
from minilm_jax.tasks.inputs import dummy_batch, is_pair, parse_tasks, task_data_dirs, task_features
from minilm_jax.training.loop import begin_run
from minilm_jax.training.train_state import ConstantRate
from minilm_jax.transfer.logits import LOGIT_OBJECTIVES, check_objective, task_loss

# optimizer.name: the thesis's optimisers at a constant learning rate, AdaDelta (BiLSTM) and Adam (MKD).
OPTIMIZERS = {
  "adadelta": lambda opt: optax.adadelta(opt.lr, rho=opt.rho, eps=opt.eps),
  "adam": lambda opt: optax.adam(opt.lr, b1=opt.b1, b2=opt.b2, eps=opt.eps),
}


def task_optimizer(opt):
  """The optimiser `optimizer.name` registers (`OPTIMIZERS`), after clipping when asked."""
  if opt.name not in OPTIMIZERS:
    raise UserError(f"optimizer.name={opt.name!r}: choose {' or '.join(OPTIMIZERS)}")
  tx = OPTIMIZERS[opt.name](opt)
  return optax.chain(optax.clip_by_global_norm(opt.clip_norm), tx) if opt.clip_norm > 0 else tx


def transformer_init(encoder_params: dict, num_layers: int) -> dict:
  """The 3-layer Transformer student's body from a teacher encoder: its embeddings, first layers and pooler."""
  available = layout.num_layers(encoder_params)
  if num_layers > available:
    raise UserError(f"student.num_layers={num_layers} but the encoder to initialise from has {available} layers")
  return {"encoder": layout.first_layers(encoder_params, num_layers)}


@dataclasses.dataclass(frozen=True)
class _Start:
  """A distilled student a run goes on from (`student.from_run`)."""

  tokenizer: Any
  encoder_config: EncoderConfig | None  # the Transformer student's; None for the LSTMs
  params: dict  # its body and a head per task of the new run


@lock.released_on_error
def build_task_distillation(config, workdir: str, mesh=None) -> MultiTaskRun:
  """A task (or multi-task) distillation run's parts, built and validated before any compute;
  `run()` trains and evaluates. The student's vocabulary is the first teacher's tokenizer
  (WordPiece, as the thesis's students), unless word vectors, a distilled student or the encoder a
  Transformer student starts from (`student.init`) give one."""
  # MKD's last stage: a distilled student (its block, tokenizer, body and these tasks' heads) goes
  # on. Its block is filled in first, so that a rerun compares the config it ran with.
  record = _student_of_run(config) if config.student.from_run else None
  if task_distill_config.left_to_run(config.student):
    raise UserError("student.from_run is required: this config leaves the student to the run it goes on from")
  resumed = begin_run(config, workdir, task_distill_config.RANGES)
  tasks = parse_tasks(config.tasks)
  mesh = mesh or parallel.make_mesh(config.mesh.data, 1)
  start = _continue_from(config, tasks, mesh, record) if record else None
  kind = config.student.kind
  joint = student_kind(kind).joint
  for task in tasks:
    check_objective(config.objective, task.head()["num_labels"], task.name)
  teacher_runs = teacher_paths(config.teacher, "teacher")
  objective = LOGIT_OBJECTIVES[config.objective]
  vectors = config.student.word_vectors and start is None
  if not teacher_runs and (objective.from_teacher or not (vectors or start)):
    raise UserError(
      "config.teacher is empty: pass the workdir of a run fine-tuned on each task "
      "(its tokenizer is also the student's vocabulary, unless student.word_vectors or student.from_run gives one)"
    )
  teachers = find_teachers(teacher_runs, tasks) if objective.from_teacher else {}
  labellers, weights = _teachers_read(config, workdir, teachers, resumed)
  data_dirs = task_data_dirs(tasks, config.data_dir)
  train_examples = {t.name: t.load("train", data_dirs[t.name], "") for t in tasks}
  if start is not None:
    tokenizer, embedding_table, encoder_config, init_body = start.tokenizer, None, start.encoder_config, None
  else:
    tokenizer, embedding_table = _vocabulary(config, vectors, tasks, train_examples, teacher_runs)
    encoder_config, init_body = _transformer_body(config.student, teacher_runs) if joint else (None, None)
  inputs = _vectors_read(config, workdir, resumed) if vectors else {}
  cache_dir = config.cache_dir or os.path.join(workdir, "cache")
  augmenting = config.augment.enabled and objective.from_teacher
  heads = tuple((t.name, t.head()["num_labels"]) for t in tasks)
  model = make_student(config.student, heads, len(tokenizer), encoder_config)

  def training_rows(task) -> datasets.Dataset:
    """Inputs plus the gold label ("hard") or the teacher's logits, on the training set augmented
    unless augmentation is off."""
    c = config
    examples = train_examples[task.name]
    if augmenting:
      examples = augment.augmented(examples, tokenizer.mask_token, c.augment, cache_dir, f"augment {task.name}")
    features = task_features(joint, task, examples, tokenizer, c.max_seq_length)
    if not objective.from_teacher:
      return features
    logits = labellers[task.name](task, examples, c.max_seq_length, c.eval_batch_size, mesh, cache_dir)
    return features.add_column("teacher_logits", [row.tolist() for row in logits.astype(np.float32)])

  record = RunRecord(
    TASK_STUDENT,
    encoder_config,
    json.loads(config.to_json()),
    heads=heads,
    tasks=tuple(t.name for t in tasks),
    task_student_settings=config.student.to_dict(),
    vocab_size=len(tokenizer),
    teacher_weights=weights,
    inputs=inputs,
  )
  spec = MultiTaskSpec(
    tasks=tasks,
    tokenizer=tokenizer,
    model=model,
    joint=joint,
    loss=partial(task_loss, config.objective, temperature=config.temperature),
    target=objective.column,
    training_rows=training_rows,
    init_params=partial(_init_params, model, dummy_batch(joint, tasks), start, init_body, embedding_table),
    optimizer=lambda _: (lambda _: task_optimizer(config.optimizer), ConstantRate(np.float32(config.optimizer.lr))),
    record=record,
    summary={"tasks": [t.name for t in tasks], "student": kind, "objective": config.objective},
    desc=f"distill {config.tasks} -> {kind}",
  )
  return assemble_multitask_run(config, workdir, mesh, spec)


def _init_params(model, dummy: dict, start, init_body, embedding_table, rng):
  """The student's first parameters: every one from a distilled student (`start`), or fresh ones
  with the Transformer's body from an encoder's first layers, or the LSTMs' embeddings from the
  word vectors (in every channel)."""
  if start is not None:
    return start.params
  params = model.init(rng, dummy)["params"]
  if init_body is not None:
    params = {**params, "body": init_body}
  if embedding_table is not None:
    table = jnp.asarray(embedding_table)
    body = {name: {"embedding": table} if "embedding" in name else p for name, p in params["body"].items()}
    params = {**params, "body": body}
  return params


def _teachers_read(config, workdir: str, teachers: dict, resumed: RunRecord | None) -> tuple:
  """({task: `teacher_logits` of its teacher run}, the runs' content digests together, or None
  without teachers). Each run is digested once, before any weights are read: its logits are cached
  under that digest, the record keeps them together, and a resumed run (`resumed`: its record)
  takes only the teachers it started from."""
  read_as = {name: run.content_digest() for name, run in teachers.items()}
  labellers = {name: partial(teacher_logits, run, read_as=read_as[name]) for name, run in teachers.items()}
  if not read_as:
    return labellers, None
  weights = hashlib.sha256(json.dumps(sorted(read_as.items())).encode()).hexdigest()
  check_same_teacher(f"teacher={config.teacher}", workdir, weights, resumed)
  return labellers, weights


def _vectors_read(config, workdir: str, resumed: RunRecord | None) -> dict:
  """The record's `inputs` of a run on word vectors, checked against the run it resumes: the
  vectors' words are the student's vocabulary, so a file changed after a kill would move every row."""
  path = config.student.word_vectors
  digest = file_digest(path)
  check_same_inputs(workdir, {"student.word_vectors": (path, digest)}, resumed)
  return {"student.word_vectors": digest}


def _vocabulary(config, vectors: bool, tasks, train_examples: dict, teacher_runs: list):
  """(tokenizer, word-vector table or None) of a new student (the config's `student` block): the
  words of its vectors file (the table's rows for words it lacks drawn from the run's seed), the
  encoder a Transformer starts from, or the first teacher's WordPiece."""
  student = config.student
  if vectors:
    return _word_tokenizer(student, tasks, train_examples, config.seed)
  if student_kind(student.kind).joint and student.init:  # the vocabulary its embeddings were trained on
    return runs.load_tokenizer_of(student.init, "student.init"), None
  return runs.load_tokenizer_of(teacher_runs[0]), None


def _transformer_body(student, teacher_runs: list):
  """(the student's own encoder config, its body's parameters) of a Transformer student: the
  first `student.num_layers` layers of `student.init` (default: the first teacher's encoder)."""
  body = runs.load_encoder(student.init or teacher_runs[0], "float32", "student.init")
  # The student's own encoder (its first `num_layers` layers), as its record and export read it.
  return body.config.replace(num_layers=student.num_layers), transformer_init(body.params, student.num_layers)


def _student_of_run(config):
  """The record of `student.from_run`, a task-distillation run, whose student block fills this
  config's: a field left unset (`task_distill.config.student_from_run`) takes the run's value, and
  one given that differs from it is refused: the run's student goes on as it is."""
  source = config.student.from_run
  record = runs.read_record(source) if runs.is_run(source) else None
  if record is None or not record.task_student:
    raise UserError(
      f"student.from_run={source} is not a task-distillation run's workdir: pass the workdir of a "
      f"`python -m minilm_jax.distill_task` run (the MKD student to fine-tune per task)"
    )
  for key, value in record.task_student_settings.items():
    if key == "from_run" or key not in config.student:
      continue
    given = config.student[key]
    if given is not None and given != value:
      raise UserError(
        f"student.{key}={given} contradicts student.from_run={source}, whose student has {key}={value}: "
        f"leave student.{key} out (configs/task/mkd_finetune.py leaves the student to the run)"
      )
    setattr(config.student, key, value)
  return record


def _continue_from(config, tasks, mesh, record) -> _Start:
  """What a run starting from the student of `student.from_run` takes from it (`record`, its run
  record): the run's tokenizer, encoder config, body and these tasks' heads."""
  source = config.student.from_run
  missing = [t.name for t in tasks if t.name not in record.tasks]
  if missing:
    raise UserError(
      f"student.from_run={source} has no head for {', '.join(missing)} (it was distilled on "
      f"{', '.join(record.tasks)}): fine-tune it on tasks it learnt"
    )
  params, tokenizer = read_multitask_run(source, mesh)[1:3]
  heads = {f"head_{t.name}": params[f"head_{t.name}"] for t in tasks}
  return _Start(tokenizer, record.encoder, {"body": params["body"], **heads})


def _word_tokenizer(student, tasks, train_examples: dict, seed: int):
  """(the word-level tokenizer of `student.word_vectors` over the tasks' training words, the
  embedding table it gives those words)."""
  if student_kind(student.kind).joint:
    raise UserError(
      f"student.word_vectors is for the LSTM students, and student.kind={student.kind!r} reads "
      f"its teacher's WordPiece tokens: use bilstm or biattentive, or leave word_vectors empty"
    )
  texts = (text for t in tasks for c in ("text_a", "text_b")[: 1 + is_pair(t)] for text in train_examples[t.name][c])
  tokenizer, vectors, dim = word_vectors.vocabulary(student.word_vectors, student.max_words, texts)
  if dim != student.embed_dim:
    raise UserError(
      f"student.embed_dim={student.embed_dim} but the vectors of student.word_vectors={student.word_vectors} "
      f"have {dim} values: set --config.student.embed_dim={dim}"
    )
  return tokenizer, word_vectors.embedding_matrix(tokenizer, vectors, dim, seed)


def read_grid(path: str) -> list:
  """The rows of an earlier `lr_grid.json` at `path` (none if there is none); a file there that is not
  a grid is refused, before the grid runs anything."""
  if not os.path.exists(path):
    return []
  try:
    rows = json.load(open(path))["rows"]
    if all("lr" in row and "dev_loss" in row for row in rows):
      return rows
  except (ValueError, KeyError, TypeError):
    pass
  raise UserError(f"{path} is not a learning-rate grid this program wrote: move it out of --workdir")


def merge_grid(earlier: list, rows: list) -> tuple[list, int]:
  """`rows` (one per learning rate) joined to the `earlier` rows whose rates they do not measure
  again, ordered by rate, and the index of the lowest dev loss among them all: a grid over other
  rates adds to the earlier one and never deletes it."""
  measured = {row["lr"] for row in rows}
  merged = sorted([row for row in earlier if row["lr"] not in measured] + rows, key=lambda row: row["lr"])
  return merged, min(range(len(merged)), key=lambda i: merged[i]["dev_loss"])


def run_lr_grid(config, workdir: str):
  """One run per learning rate of `config.lr_grid` (a comma list) in `<workdir>/lr<rate>`, and the
  rate whose runs' dev loss against the gold labels, averaged over the tasks, is lowest: MKD's last
  stage (thesis section 4.3.2: "the learning rate is chosen from {1, 1.5, 5} x 1e-5 according to
  the validation set loss on each task"). Writes `<workdir>/lr_grid.json`, merged with the rows of
  an earlier grid there (`read_grid`, `merge_grid`); returns its rows and the best row's index."""
  try:
    rates = [float(r) for r in config.lr_grid.split(",") if r.strip()]
  except ValueError:
    rates = []
  if not rates or min(rates) <= 0:
    raise UserError(
      f"lr_grid={config.lr_grid!r}: give positive learning rates, comma separated (e.g. 1e-5,1.5e-5,5e-5)"
    )
  if len(set(rates)) < len(rates):
    raise UserError(f"lr_grid={config.lr_grid!r} names a learning rate twice: give each once")
  if not workdir:
    raise UserError("--workdir is required: the grid's runs and lr_grid.json go there")
  path = os.path.join(workdir, "lr_grid.json")
  earlier = read_grid(path)
  rows = []
  for rate in rates:
    run_config = copy.deepcopy(config)
    run_config.optimizer.lr, run_config.lr_grid = rate, ""
    run_dir = os.path.join(workdir, f"lr{rate:g}")
    results = build_task_distillation(run_config, run_dir).run()[1]
    losses = [v for k, v in results.items() if k.endswith("/loss")]
    rows.append({"lr": rate, "workdir": run_dir, "dev_loss": float(np.mean(losses)), **results})
  rows, best = merge_grid(earlier, rows)
  if jax.process_index() == 0:
    write_json(path, {"rows": rows, "best": rows[best]})
  return rows, best
