"""The evaluator registry: what a distillation or fine-tuning run measures while it trains.
Evaluators named in the config, each with its kind, its data and how often it runs (big_vision's
pattern), called by the training loop on the mesh at step 0 (the model it starts from) and every
`every` steps, logged beside the loss as `eval/<name>/<metric>` (metrics.jsonl and TensorBoard); a
distillation teacher's own score once per process as `eval/<name>/teacher/<metric>`:

  c.evaluators.heldout = dict(kind="heldout", every=100)
  c.evaluators.wordnet = dict(kind="retrieval", every=100, data="wordnet", data_dir=...)
  c.evaluators.sts = dict(kind="sts", every=100, file="sts-dev.tsv")
  c.evaluators.supersense = dict(kind="probe", every=100, task="wordnet_supersense", data_dir=...)
  c.checkpoint.best = "heldout/loss"  # keep the best step beside the newest ones
  # a fine-tuning run: its task's dev metrics, and a probe of its encoder's sentence embeddings
  c.evaluators.task = dict(kind="task", every=200); c.checkpoint.best = "task/dev/accuracy"

Kinds (each one registered function, `KINDS`):
- `heldout`: every loss term of the objective on the corpus's last `data.heldout_blocks` blocks,
  which training never reads (deterministic dropout off; the teacher is its own target, so it has no score).
- `retrieval`: recall@1, recall@10 and MRR@10 of cosine ranking, and the mean cosine of unrelated
  queries (`evaluation/sentences.py`), on WordNet (`data="wordnet"`, definitions -> example
  sentences) or on the user's TSV of `query<TAB>relevant document` lines.
- `sts`: Spearman's correlation of the cosine with the gold scores of an STS-B-format TSV.
- `probe`: dev accuracy of a logistic regression (scikit-learn) on the frozen, pooled embeddings
  of a one-sentence classification task's training split: a named task, or `task="custom"` with
  `train`/`dev` files.
- `task` (fine-tuning runs): the run's own evaluation of its dev splits (`dev/accuracy`, ...), the
  one `results.json` records after every epoch, at any step.

Embeddings are the student's sentence embeddings as its export computes them (the teacher's
pooling, the learnt map to the teacher's width when there is one; a fine-tuning run's encoder, with
the pooling of the model it started from). Every evaluator compiles once (fixed batch and length)
and then only runs. A kind that needs what only one program has (`Kind.needs`: held-out blocks,
a task) is refused by the other in one line.
"""

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream
from minilm_jax.devices import parallel
from minilm_jax.devices.distributed import host_scalars
from minilm_jax.errors import UserError
from minilm_jax.evaluation import sentences
from minilm_jax.evaluation.sentences import SentenceEncoder
from minilm_jax.models import embeddings
from minilm_jax.models.encoder import Encoder
from minilm_jax.tasks import custom, get_task, glue


@dataclasses.dataclass(frozen=True)
class Kind:
  build: Callable  # (name, spec, context) -> Evaluator
  fields: dict  # the kind's own fields and their defaults (besides kind and every)
  metrics: tuple  # what it reports; "loss*" stands for every loss term, "*" for any name
  lower_is_better: tuple = ()
  needs: str = ""  # what only some programs provide ("heldout": held-out blocks; "task": a fine-tuned task)


KINDS: dict[str, Any] = {}  # kind -> evaluator class (`fields`, `build`, `lower_is_better`)

# What each program provides to the kinds that need it (`Kind.needs`).
DISTILLATION_PROVIDES, FINETUNING_PROVIDES = ("heldout",), ("task",)


def register(kind: str, fields: dict, metrics: tuple, lower_is_better: tuple = (), needs: str = ""):
  def add(build):
    KINDS[kind] = Kind(build, fields, metrics, lower_is_better, needs)
    return build

  return add


@dataclasses.dataclass
class Evaluator:
  name: str
  every: int
  student: Callable  # params -> {metric: value}
  teacher: Callable | None = None  # () -> {metric: value}
  texts: tuple = ()  # sentences it embeds: what the speed measurement encodes


@dataclasses.dataclass
class TeacherScores:
  """The teacher's side of a run's evaluations, shared by every student of a family: its sentence
  encoders by length, its scores by evaluator and its speed, each computed once a process."""

  encoders: dict = dataclasses.field(default_factory=dict)
  scores: dict = dataclasses.field(default_factory=dict)
  speed: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Context:
  """What the evaluators of one run share: built once by the distillation or fine-tuning program.
  The student's parameters are a distillation student's (its encoder and learnt maps, `learnt`) or a
  task model's ({"encoder": ..., head}); a fine-tuning run has no teacher and no held-out blocks, a
  distillation run no task."""

  mesh: jax.sharding.Mesh
  tokenizer: object
  student: Encoder
  student_pooling: embeddings.Pooling
  max_seq_length: int  # the run's, for evaluators that set none
  eval_batch_size: int
  num_steps: int  # every evaluator also runs at the last step
  learnt: bool = True
  teacher: Encoder | None = None
  teacher_params: dict | None = None
  # The teacher's (pooling, Dense) of `teacher_path`: a run teacher's, read with its weights; None: read its files
  teacher_pipeline: tuple | None = None
  teacher_path: str = ""
  teacher_scores: TeacherScores = dataclasses.field(default_factory=TeacherScores)
  heldout_stream: BatchStream | None = None
  heldout_step: Callable | None = None  # (params, batch, teacher_params) -> {loss terms}
  task_evaluate: Callable | None = None  # params -> the fine-tuning run's dev metrics
  _student_encoders: dict = dataclasses.field(default_factory=dict)

  def length(self, asked: int) -> int:
    """An evaluator's `max_seq_length` (`asked`), or the run's where it asks for none (0)."""
    return asked or self.max_seq_length

  def student_encoder(self, length: int) -> SentenceEncoder:
    if length not in self._student_encoders:
      self._student_encoders[length] = SentenceEncoder(
        self.student, self.student_pooling, self.tokenizer, self.mesh, self.eval_batch_size, length, self.learnt
      )
    return self._student_encoders[length]

  def teacher_encoder(self, length: int) -> SentenceEncoder | None:
    if self.teacher is None:
      return None
    encoders = self.teacher_scores.encoders
    if length not in encoders:
      pooling, dense = self.teacher_pipeline or runs.sentence_pipeline_of(self.teacher_path, length)
      encoder = SentenceEncoder(self.teacher, pooling, self.tokenizer, self.mesh, self.eval_batch_size, length)
      encoders[length] = encoder.use(self.teacher_params, dense)
    return encoders[length]


def evaluator(kind: str, every: int, **fields) -> ml_collections.ConfigDict:
  """A config's evaluator entry with every field of its kind (so each can be overridden on the
  command line): `c.evaluators.wordnet = evaluator("retrieval", 100, data_dir=...)`."""
  if kind not in KINDS:
    raise UserError(f"evaluator kind {kind!r} is unknown: choose one of {', '.join(sorted(KINDS))}")
  return ml_collections.ConfigDict({"kind": kind, "every": every, **KINDS[kind].fields, **fields})


def _check_task_metric(config, task):
  """`checkpoint.best` naming a `task` evaluator (whose metrics only the run's task knows, so the
  kind's table takes any) held against what the task reports: `<split>/<metric>` with one of its
  dev splits and a metric of its own, or one of the family a metric names (per language,
  HasAns/NoAns, the best threshold's: `f1_de`, `best_f1`)."""
  name, _, metric = config.checkpoint.best.partition("/")
  if config.evaluators[name].kind != "task":
    return
  split, _, score = metric.partition("/")
  of_task = lambda m: score == m or score.startswith(m + "_") or score.endswith("_" + m) or f"_{m}_" in score
  if split not in task.eval_splits or not any(of_task(m) for m in task.metrics):
    reported = ", ".join(f"{s}/{m}" for s in task.eval_splits for m in task.metrics)
    raise UserError(f"checkpoint.best={config.checkpoint.best!r}: {task.name} reports {reported}: pick one of them")


def check_specs(config, provides: tuple, task=None):
  """One line for the first evaluator (or `checkpoint.best`) the config gets wrong, before any work;
  `provides`: what the program has for the kinds that need it (`DISTILLATION_PROVIDES`,
  `FINETUNING_PROVIDES`); `task`: a fine-tuning run's, whose metrics its `task` evaluator reports."""
  usable = sorted(kind for kind, k in KINDS.items() if not k.needs or k.needs in provides)
  for name, spec in config.evaluators.items():
    _check_spec(name, spec, usable, config)
  best = config.checkpoint.best
  if best:
    name, _, metric = best.partition("/")
    if name not in config.evaluators:
      raise UserError(
        f"checkpoint.best={best!r} names no evaluator: use <evaluator>/<metric> with one of "
        f"{sorted(config.evaluators) or 'the evaluators you add to the config'}"
      )
    known = KINDS[config.evaluators[name].kind].metrics
    if not any(metric == m or (m.endswith("*") and metric.startswith(m[:-1])) for m in known):
      raise UserError(f"checkpoint.best={best!r}: evaluator {name} reports {', '.join(known)}")
    if task is not None:
      _check_task_metric(config, task)


def _check_spec(name: str, spec, usable: list, config):
  """One line for what evaluator `name`'s `spec` gets wrong: its kind (one of `usable`), how often,
  its fields, its length, the files it names."""
  kinds = ", ".join(usable)
  if not isinstance(spec, ml_collections.ConfigDict) or "kind" not in spec:
    raise UserError(f"evaluators.{name} has no kind: give it kind= one of {kinds}")
  if spec.kind not in KINDS:
    raise UserError(f"evaluators.{name}.kind={spec.kind!r} is unknown: choose one of {kinds}")
  if spec.kind not in usable:
    raise UserError(
      f"evaluators.{name}.kind={spec.kind!r} needs {KINDS[spec.kind].needs}, which this program's runs do not "
      f"have: choose one of {kinds}"
    )
  if not isinstance(spec.get("every"), int) or spec.every < 1:
    raise UserError(f"evaluators.{name}.every={spec.get('every')!r}: evaluate every 1 or more steps")
  if spec.kind == "heldout" and config.data.heldout_blocks < config.batch_size:
    raise UserError(
      f"evaluators.{name} (heldout) needs blocks held out of training: set data.heldout_blocks to at least "
      f"one batch ({config.batch_size})"
    )
  fields = KINDS[spec.kind].fields
  unknown = sorted(set(spec.keys()) - {"kind", "every"} - set(fields))
  if unknown:
    raise UserError(
      f"evaluators.{name} has fields {unknown} that kind {spec.kind} does not read: "
      f"it reads {', '.join(['every', *fields])}"
    )
  length = spec.get("max_seq_length", 0)
  if not isinstance(length, int) or isinstance(length, bool) or length < 0 or length == 1:
    raise UserError(
      f"evaluators.{name}.max_seq_length={length!r}: give a length of at least 2 tokens, or 0 for data.max_seq_length"
    )
  for field in ("file", "train", "dev", "data", "data_dir"):
    path = spec.get(field)
    if path and not (field == "data" and path == "wordnet"):
      if not (os.path.isdir if field == "data_dir" else os.path.isfile)(path):
        raise UserError(f"evaluators.{name}.{field}={path!r} does not exist: fix the path")


def check_lengths(config, positions: int):
  """One line for the first evaluator whose length exceeds the models' `positions`, before any work
  (a longer one would ask for memory it cannot use, minutes into the run)."""
  for name, spec in config.evaluators.items():
    length = spec.get("max_seq_length", 0)
    if length > positions:
      raise UserError(
        f"evaluators.{name}.max_seq_length={length} exceeds the {positions} positions of the model it reads: "
        f"give at most {positions}"
      )


def with_defaults(spec) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({**KINDS[spec.kind].fields, **spec.to_dict()})


def best_direction(config) -> tuple | None:
  """(metric key in the logged metrics, whether higher is better) of `checkpoint.best`, or None."""
  if not config.checkpoint.best:
    return None
  name, _, metric = config.checkpoint.best.partition("/")
  kind = KINDS[config.evaluators[name].kind]
  lower = any(metric == m or (m.endswith("*") and metric.startswith(m[:-1])) for m in kind.lower_is_better)
  return f"eval/{name}/{metric}", not lower


_SPEED_SENTENCES = 512


class Evaluators:
  """The run's evaluators: `__call__(step, params)` runs those due at `step` (every `every` steps and
  the last) and returns their metrics (with the teacher's the first time each runs in this process;
  a family's students share the teacher's scores, `TeacherScores`, so it is scored once)."""

  def __init__(self, config, context: Context):
    self.items = [
      KINDS[spec.kind].build(name, with_defaults(spec), context) for name, spec in config.evaluators.items()
    ]
    self.context, self.num_steps = context, context.num_steps
    self._teacher_done: set[str] = set()

  def __bool__(self):
    return bool(self.items)

  def __call__(self, step: int, params) -> dict:
    out = {}
    for e in self.items:
      if step % e.every and step != self.num_steps:
        continue
      out.update({f"eval/{e.name}/{k}": v for k, v in e.student(params).items()})
      if e.teacher is not None and e.name not in self._teacher_done:
        scores = self.context.teacher_scores.scores
        if e.name not in scores:
          scores[e.name] = e.teacher()
        out.update({f"eval/{e.name}/teacher/{k}": v for k, v in scores[e.name].items()})
        self._teacher_done.add(e.name)
    return out

  def speed(self, params) -> dict:
    """Sentences per second of the student and the teacher on the first embedding evaluator's
    texts (after a warm-up call): {} when no evaluator embeds sentences."""
    texts = next((e.texts for e in self.items if e.texts), ())[:_SPEED_SENTENCES]
    if not texts:
      return {}
    length = self.context.max_seq_length
    out = {"student": self._sentences_per_second(self.context.student_encoder(length), texts, params)}
    teacher, measured = self.context.teacher_encoder(length), self.context.teacher_scores.speed
    if teacher is not None:
      if length not in measured:
        measured[length] = self._sentences_per_second(teacher, texts, None)
      out["teacher"] = measured[length]
    return out

  def _sentences_per_second(self, encoder, texts, params) -> float:
    encoder(texts[: self.context.eval_batch_size], params)  # compiled before the timing
    start = time.perf_counter()
    encoder(texts, params)
    return len(texts) / (time.perf_counter() - start)


@register("heldout", {}, ("loss*",), lower_is_better=("loss*",), needs="heldout")
def heldout(name, spec, context: Context) -> Evaluator:
  stream, step, mesh = context.heldout_stream, context.heldout_step, context.mesh
  assert stream is not None and step is not None, "check_specs refuses a heldout evaluator without held-out blocks"

  def student(params):
    totals = None
    for b in range(stream.batches_per_epoch):
      terms = step(params, parallel.shard_batch(stream.batch(b), mesh), context.teacher_params)
      totals = terms if totals is None else jax.tree.map(lambda a, x: a + x, totals, terms)
    return {k: float(v) / stream.batches_per_epoch for k, v in host_scalars(totals).items()}

  return Evaluator(name, spec.every, student)


def _embedding_evaluator(name, spec, context: Context, texts: list, score) -> Evaluator:
  """An evaluator of embeddings: `score(embed)` with `embed(texts) -> [N, D]`, for the student and
  for the teacher; `texts` are every sentence it embeds (the speed measurement's)."""
  length = context.length(spec.max_seq_length)
  student_encoder, teacher_encoder = context.student_encoder(length), context.teacher_encoder(length)
  teacher = None
  if teacher_encoder is not None:
    teacher = lambda: score(lambda t: teacher_encoder(t, desc=f"eval/{name}/teacher"))
  return Evaluator(
    name,
    spec.every,
    student=lambda params: score(lambda t: student_encoder(t, params, f"eval/{name}")),
    teacher=teacher,
    texts=tuple(texts),
  )


_RETRIEVAL_METRICS = ("recall@1", "recall@10", "mrr@10", "unrelated_cosine")


@register(
  "retrieval",
  {"data": "wordnet", "data_dir": "", "split": "dev", "max_seq_length": 0},
  _RETRIEVAL_METRICS,
  lower_is_better=("unrelated_cosine",),
)
def retrieval(name, spec, context: Context) -> Evaluator:
  if spec.data == "wordnet":
    data = sentences.wordnet_retrieval(spec.data_dir, spec.split)
  else:
    data = sentences.read_retrieval_pairs(spec.data, f"evaluators.{name}.data")
  if not data.queries:
    raise UserError(f"evaluators.{name}: {spec.data} gives no queries: give it query/document pairs")

  def score(embed):
    queries = embed(data.queries)
    return {
      **sentences.retrieval_scores(queries, embed(data.documents), data.relevant),
      "unrelated_cosine": sentences.unrelated_cosine(queries),
    }

  return _embedding_evaluator(name, spec, context, data.queries + data.documents, score)


@register("sts", {"file": "", "max_seq_length": 0}, ("spearman",))
def sts(name, spec, context: Context) -> Evaluator:
  if not spec.file:
    raise UserError(f"evaluators.{name} (sts) needs file= an STS-B-format TSV (sentence1, sentence2, score)")
  pairs = glue.TASKS["stsb"].load_file(spec.file, labelled=True)
  a, b, gold = list(pairs["text_a"]), list(pairs["text_b"]), np.asarray(pairs["label"])
  if len(a) < 2:
    raise UserError(
      f"evaluators.{name}.file={spec.file} has {len(a)} scored sentence pairs: a Spearman correlation needs 2 or more"
    )

  def score(embed):
    return {"spearman": sentences.sts_spearman(embed(a), embed(b), gold)}

  return _embedding_evaluator(name, spec, context, a + b, score)


@register(
  "probe",
  {
    "task": "wordnet_supersense",
    "data_dir": "",
    "train": "",
    "dev": "",
    "text_column": "text",
    "label_column": "label",
    "max_seq_length": 0,
  },
  ("accuracy",),
)
def probe(name, spec, context: Context) -> Evaluator:
  if spec.task == "custom":
    task = custom.custom_task(
      ml_collections.ConfigDict(
        {
          "train": spec.train,
          "dev": spec.dev,
          "text_columns": spec.text_column,
          "label_column": spec.label_column,
          "labels": "",
          "regression": False,
          "metrics": "",
        }
      )
    )
  else:
    task = get_task(spec.task)
  if getattr(task, "labels", None) is None or len(task.text_columns) != 1:
    raise UserError(
      f"evaluators.{name}.task={spec.task}: a probe classifies single sentences; choose a one-sentence "
      f"classification task (wordnet_supersense, sst2, cola) or task=custom"
    )
  try:
    train, dev = task.load("train", spec.data_dir), task.load("dev", spec.data_dir)
  except UserError as e:  # the task names its own `data_dir`; the probe reads the evaluator's
    raise UserError(f"evaluators.{name}: {str(e).replace('data_dir', f'evaluators.{name}.data_dir')}") from None
  train_texts, dev_texts = list(train["text_a"]), list(dev["text_a"])
  train_y, dev_y = np.asarray(train["label"]), np.asarray(dev["label"])

  def score(embed):
    return {"accuracy": probe_accuracy(embed(train_texts), train_y, embed(dev_texts), dev_y)}

  return _embedding_evaluator(name, spec, context, train_texts + dev_texts, score)


@register("task", {}, ("*",), needs="task")
def task(name, spec, context: Context) -> Evaluator:
  assert context.task_evaluate is not None, "check_specs refuses a task evaluator outside a fine-tuning run"
  return Evaluator(name, spec.every, context.task_evaluate)


def probe_correct(train_NxD, train_y, dev_MxD, dev_y) -> np.ndarray:
  """Which dev examples scikit-learn's logistic regression (default L2, lbfgs) fitted on frozen
  embeddings gets right (bool per example)."""
  from sklearn.linear_model import LogisticRegression

  classifier = LogisticRegression(max_iter=2000).fit(np.asarray(train_NxD, np.float64), train_y)
  return classifier.predict(np.asarray(dev_MxD, np.float64)) == np.asarray(dev_y)


def probe_accuracy(train_NxD, train_y, dev_MxD, dev_y) -> float:
  """Dev accuracy of the logistic-regression probe on frozen embeddings (see `probe_correct`)."""
  return float(np.mean(probe_correct(train_NxD, train_y, dev_MxD, dev_y)))


def summary(config, rows: list, speed: dict, sizes: dict) -> str:
  """A student's evaluations as one table, from the rows of its metrics (metrics.jsonl's, as a lone
  run logs them): the teacher, the student it started from (step 0), the last evaluated step and
  (with `checkpoint.best`) the best one; their sizes and sentences/s; and the change of each score
  from the start to the last step."""
  evaluated = [r for r in rows if any(k.startswith("eval/") for k in r)]
  if not evaluated:
    return ""
  # Scores, not the heldout's separate loss terms (those are in metrics.jsonl).
  columns = []
  for r in evaluated:
    for k in r:
      name = k.split("/")
      if k.startswith("eval/") and name[2] != "teacher" and not name[-1].startswith("loss_") and k not in columns:
        columns.append(k)
  teacher = {}
  for r in evaluated:
    teacher.update({k.replace("/teacher/", "/"): v for k, v in r.items() if "/teacher/" in k})
  start = evaluated[0] if evaluated[0]["step"] == 0 else None
  last = evaluated[-1]
  lines = []
  s = config.student
  init = "random init" if s.init == "random" else f"the teacher's {config.etd.layers} layers, undistilled"
  table = [("teacher", sizes["teacher"], speed.get("teacher"), teacher)]
  if start is not None:
    table.append((f"start (step 0): {init}", sizes["student"], speed.get("student"), start))
  if last is not start:
    table.append((f"student (step {last['step']})", sizes["student"], speed.get("student"), last))
  best = best_direction(config)
  if best:
    metric, higher = best
    ranked = [r for r in evaluated if metric in r]
    top = (max if higher else min)(ranked, key=lambda r: r[metric])
    if top is not last and top is not start:
      table.append((f"best {metric[5:]} (step {top['step']})", sizes["student"], speed.get("student"), top))
  header = ["model", "parameters", "sentences/s"] + [c[5:] for c in columns]
  lines.append("| " + " | ".join(header) + " |")
  lines.append("|" + " --- |" * len(header))
  for label, size, rate, scores in table:
    cells = [label, f"{size / 1e6:.1f}M", f"{rate:,.0f}" if rate else "-"]
    cells += [f"{scores[c]:.4f}" if c in scores else "-" for c in columns]
    lines.append("| " + " | ".join(cells) + " |")
  if start is not None and last is not start:
    changes = [f"{c[5:]} {start[c]:.4f} -> {last[c]:.4f}" for c in columns if c in start and c in last]
    lines.append(f"from step 0 to step {last['step']}: " + "; ".join(changes))
  return "\n".join(lines)
