"""`students` suite: which student is worth fine-tuning, at one distillation budget, over several
tasks and seeds.

Every model is scored on each task two ways: fine-tuned (mean-pooled encoder + linear head, the
same optimiser and epochs for every model, `seeds` runs each; the last epoch's dev score, nothing
picked on the dev set) and probed frozen (scikit-learn's logistic regression on its sentence
embeddings). The models are `recipes`'.

Noise: two models are within noise when their means over tasks differ by less than twice the
standard error of the difference. Fine-tuned, that error comes from the seeds (each model's standard
deviation over seeds of its mean over tasks). Frozen, every model is probed on the same dev examples,
so the difference is paired by example (McNemar's view): examples both models get right or both get
wrong cancel, and the error is that of the per-example difference of correctness, far smaller than
two independent sampling errors when the models agree on most examples.
"""

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from minilm_jax import runs
from minilm_jax.benchmarks.students.log import MeasurementLog, Spent
from minilm_jax.benchmarks.students.recipes import ENSEMBLES, RECIPES, TWO_STAGE, student_config
from minilm_jax.benchmarks.students.scores import BASELINES, ModelScores, rank
from minilm_jax.benchmarks.students.settings import Settings
from minilm_jax.benchmarks.students.tasks import BenchTask, parse_tasks
from minilm_jax.data import augment
from minilm_jax.devices import parallel
from minilm_jax.distill.config import demo_teacher
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.evaluation.evaluators import probe_correct
from minilm_jax.evaluation.sentences import SentenceEncoder
from minilm_jax.finetuning.config import base_config as finetune_config
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.finetuning.teachers import find_teachers, teacher_logits
from minilm_jax.tasks import selection_metric

# A measured fine-tuning saves every this many steps in a workdir kept beside the models: a suite
# stopped mid-way (SIGTERM saves at once, SIGKILL loses at most these steps) resumes it when rerun.
# A second stage is about 1,800 steps, 20-40 minutes on a 2-core CPU.
RESUME_EVERY = 200
# A first stage saves every this many steps (about 7-15 minutes on a 2-core CPU), so a suite stopped
# during one resumes it. Saving changes nothing the model depends on: its key keeps the recipe's
# settings, in which a distillation saves only at its end.
DISTILL_RESUME_EVERY = 100


def measured_settings(config) -> dict:
  """What a distilled model's measurements are keyed by: its distillation config, less `mesh` (the
  devices a run splits its batch over: where it ran, as the host is, not what it learnt). A key that
  held it lost every measurement logged before the field existed."""
  settings = config.to_dict()
  settings.pop("mesh", None)
  return settings


@dataclasses.dataclass(frozen=True)
class _FineTuning:
  """One fine-tuning the suite runs: of `task`, with `seed`, for `epochs` at `length` and `lr`, in
  `workdir` (resumed from its latest checkpoint, if any), saving every `checkpoint_every` steps;
  `distill`: the config's `distill` and `augment` fields of a second stage ({"distill.teacher": run, ...})."""

  task: BenchTask
  seed: int
  epochs: int
  length: int
  lr: float
  workdir: str = ""
  checkpoint_every: int = 10**9
  distill: dict = dataclasses.field(default_factory=dict)

  def score(self, init: str, mesh) -> float:
    """The last epoch's dev score of `init` fine-tuned so."""
    c, task = finetune_config(), self.task
    c.task, c.init, c.data_dir, c.epochs, c.max_seq_length = task.name, init, task.data_dir, self.epochs, self.length
    if task.custom_data is not None:
      c.data = task.custom_data
    c.seed, c.optimizer.lr, c.checkpoint.every = self.seed, self.lr, self.checkpoint_every
    # The host reads the metrics every 20 steps, which also bounds how many steps are queued ahead on
    # the devices (XLA's CPU collectives can stall with hundreds queued on 8 fake devices).
    c.log_every = 20
    for field, value in self.distill.items():
      block, name = field.split(".")
      setattr(c[block], name, value)
    _, results = build_finetuning(c, self.workdir, mesh).run()
    return results[selection_metric(task.task)]


def _probe(init: str, task: BenchTask, length: int, mesh) -> str | None:
  """Which dev examples a logistic-regression probe of `init`'s frozen sentence embeddings gets
  right, as a string of 0s and 1s (one per example, in the dev set's order); None for a
  sentence-pair task or a regression (no example is right or wrong)."""
  if len(task.task.text_columns) != 1 or task.task.labels is None:
    return None
  encoder = SentenceEncoder.load(init, mesh, 64, length)
  train, dev = task.task.load("train", task.data_dir), task.task.load("dev", task.data_dir)
  embed = lambda texts, split: encoder(list(texts), desc=f"probe {task.label} {split}")
  correct = probe_correct(
    embed(train["text_a"], "train"), np.asarray(train["label"]), embed(dev["text_a"], "dev"), np.asarray(dev["label"])
  )
  return "".join("1" if right else "0" for right in correct)


@dataclasses.dataclass
class _Model:
  """One model of the suite, distilled (or, for the teacher and the baselines, written) when a
  measurement first needs it: not at all when the log holds every one."""

  name: str
  teacher: str
  config: Any  # its distillation config; None for the teacher
  workdir: str
  mesh: Any
  log: MeasurementLog
  key: dict  # what its scores depend on besides the task and seed
  logged_only: bool = False  # measure nothing: what the log lacks is None
  path: str | None = None
  distillation: Spent = Spent()

  def measured(self, task: BenchTask, what, measure: Callable[[str], Any], run_dir: str = "") -> dict | None:
    """`what` ("probe_correct" or a seed) of `task`'s log entry: from the log, else `measure(model
    path)` now (None, with `logged_only`). `run_dir`: the workdir of the fine-tuning `measure` runs,
    whose checkpoints a stopped suite resumes from (the entry says from which step: its minutes are
    this process's alone) and which are removed once the score is logged."""
    key = (self.key, f"{task.name}={task.data_dir}", what)
    if key not in self.log:
      if self.logged_only:
        return None
      path = self._path()
      resumed = _saved_step(run_dir)
      if resumed:
        logging.warning("bench students: the fine-tuning in %s resumes from its step %d", run_dir, resumed)
      started = Spent.clock()
      value = measure(path)
      self.log.add(key, value, self.distillation, Spent.since(started), resumed_from_step=resumed)
      if run_dir:
        shutil.rmtree(runs.checkpoint_dir(run_dir), ignore_errors=True)  # its results.json and metrics stay
    self.distillation = self.log.distillation_spent(self.key)
    return self.log[key]

  def _path(self) -> str:
    if self.path is None:
      started = Spent.clock()
      self.path = self.teacher
      if self.config is not None:
        self.path = self.workdir
        config = self.config.copy_and_resolve_references()
        config.checkpoint.every = DISTILL_RESUME_EVERY
        build_distillation(config, self.path, self.mesh).run()
      self.distillation = Spent.since(started) if self.name in RECIPES else Spent(0.0, 0.0)
    return self.path


def run(settings: Settings, mesh=None) -> list:
  """One row per model of `settings.models`: its fine-tuned (mean and standard deviation over seeds)
  and frozen-probe dev scores per task and over tasks, its ranks, and the models it is within noise
  of. Every measurement is appended to `settings.results` as it is done; a run given the same file
  measures only what it does not hold yet (the same model, settings, task and seed), and keeps the
  distilled students beside it (`<results>_models/`), with each fine-tuning's run: a fine-tuning
  stopped part way (SIGTERM, or a kill after its last checkpoint, every `RESUME_EVERY` steps)
  resumes there; its checkpoints are removed once its score is logged. With `logged_only`, each row
  counts the fine-tunings it lacks (`ft_missing`)."""
  settings = dataclasses.replace(settings, teacher=settings.teacher or demo_teacher())
  settings.shape  # noqa: B018 (the student's shape, checked before any work)
  known = BASELINES + tuple(RECIPES) + tuple(TWO_STAGE) + tuple(ENSEMBLES)
  unknown = [m for m in settings.models if m not in known]
  if unknown:
    raise UserError(f"unknown students {unknown}: choose from {', '.join(known)}")
  bench_tasks = parse_tasks(settings.tasks)
  mesh = parallel.make_mesh() if mesh is None else mesh
  teacher_config = runs.encoder_config_of(settings.teacher, what="--teacher")
  if settings.logged_only and not settings.results:
    raise UserError("--logged_only prints what a --results file holds: give its --results")
  log = MeasurementLog(settings.results)
  with tempfile.TemporaryDirectory() as tmp:
    suite = _Suite(settings, teacher_config, mesh, log, tmp)
    log.say_if_none_match([suite.row_model(name).key for name in settings.models], settings.logged_only)
    scores = {name: suite.measure(name, bench_tasks) for name in settings.models}
  return rank([scores[m] for m in settings.models], [t.label for t in bench_tasks])


@dataclasses.dataclass
class _Suite:
  """One `run`'s settings, shared by its models, with the teacher's architecture, where it runs and
  what it has measured."""

  settings: Settings
  teacher_config: Any
  mesh: Any
  log: MeasurementLog
  tmp: str

  def model(self, name: str, second: dict | None = None) -> _Model:
    """A model of the suite (its first stage, for a second stage's `name`), keyed by its settings
    and, for a second stage, by `second`'s."""
    s = self.settings
    config = None if name == "teacher" else student_config(name, self.teacher_config, s)
    distilled = {"distill": None if config is None else measured_settings(config), "teacher": s.teacher}
    key = {**distilled, "finetune_epochs": s.finetune_epochs, "finetune_lr": s.finetune_lr, "length": s.length}
    key.update({"second_stage": second} if second else {})
    path = self.log.model_dir(self.tmp, name, distilled)
    return _Model(name, s.teacher, config, path, self.mesh, self.log, key, s.logged_only)

  def teacher_run(self, t: BenchTask, seed: int = 0) -> str:
    """The teacher fine-tuned on `t` with `seed` (the teacher row's), kept: the second stages learn
    from the runs of the first seeds."""
    key = {**self.model("teacher").key, "task": f"{t.name}={t.data_dir}"}
    key.update({"seed": seed} if seed else {})  # seed 0's key is the one logs before several teachers hold
    path = self.log.model_dir(self.tmp, f"teacher_{t.label}" + (f"_seed{seed}" if seed else ""), key)
    if not os.path.isfile(os.path.join(path, "results.json")):
      s = self.settings
      _FineTuning(t, seed, s.finetune_epochs, s.length, s.finetune_lr, path).score(s.teacher, self.mesh)
      self._say_if_refit_differs(t, seed, path)
    return path

  def _say_if_refit_differs(self, t: BenchTask, seed: int, path: str):
    """One warning line when a teacher run fine-tuned again (its kept run is not on this machine)
    scores otherwise than the teacher row's logged seed: another machine's or version's floating
    point, whose difference the rows that learn from this run inherit."""
    logged = (self.model("teacher").key, f"{t.name}={t.data_dir}", seed)
    if logged not in self.log:
      return
    score, was = _teacher_score("", lambda: path, t), self.log[logged]["value"]
    if score != was:
      logging.warning(
        "bench students: the teacher fine-tuned again on %s with seed %d scores %.4f where %s holds %.4f "
        "(another machine or version): the rows measured from now on learn from this run",
        t.label,
        seed,
        score,
        self.log.path,
        was,
      )

  def teacher_runs(self, t: BenchTask, count: int) -> str:
    """`distill.teacher` for the teacher runs of seeds 0 to `count` - 1: a comma list."""
    return ",".join(self.teacher_run(t, seed) for seed in range(count))

  def augmented_epochs(self, t: BenchTask) -> int:
    """Epochs over the training set that take as many steps as the suite's epochs over its
    augmented set (the thesis's augmentation at the fine-tuning config's defaults)."""
    examples = t.task.load("train", t.data_dir)
    augmentation = finetune_config().augment
    augmentation.size_factor = self.settings.size_factor
    mask = runs.load_tokenizer_of(self.settings.teacher).mask_token
    rows = augment.augmented(examples, mask, augmentation, self.log.cache_dir(self.tmp), f"augment {t.label}")
    return max(1, round(self.settings.finetune_epochs * len(rows) / len(examples)))

  def row_model(self, name: str) -> _Model:
    """The model row `name` measures: the teacher for an ensemble, a second stage's first stage
    keyed with its second stage's settings."""
    if name in ENSEMBLES:
      return self.model("teacher")
    spec = TWO_STAGE.get(name, {})
    return self.model(spec.get("first", name), {**spec, "size_factor": self.settings.size_factor} if spec else None)

  def measure(self, name: str, tasks: list) -> ModelScores:
    """The row `name`'s scores on every task: its frozen probe (a second stage's first stage is
    probed in its own row) and its fine-tunings, each from the log when it holds it."""
    if name in ENSEMBLES:
      return self._ensemble(name, tasks)
    spec = TWO_STAGE.get(name, {})
    model = self.row_model(name)
    s = self.settings
    tokens = s.steps * s.batch * s.length if model.name in RECIPES else 0
    scores = ModelScores(name, "teacher" if name == "teacher" else s.student, tokens)
    for t in tasks:
      # `+long`: on the gold labels for as many steps as its second stage's epochs over the augmented set
      epochs = self.augmented_epochs(t) if "steps_of" in spec else s.finetune_epochs
      if not spec:
        probed = model.measured(t, "probe_correct", partial(_probe, task=t, length=s.length, mesh=self.mesh))
        if probed is not None:
          correct = probed["value"]
          scores.probe[t.label] = None if correct is None else np.array([c == "1" for c in correct])
      tried = []
      for seed in s.seed_range:
        run_dir = "" if name == "teacher" else self._run_dir(name, model, t, seed)  # the teacher's are kept runs
        tried.append(model.measured(t, seed, self._fine_tuning(name, t, epochs, seed, run_dir), run_dir))
      entries = [e for e in tried if e is not None]
      scores.finetuned_missing += len(tried) - len(entries)
      scores.finetuned[t.label] = [e["value"] for e in entries]
      # a resumed run's minutes are its last part's: the row's minutes are those of whole runs
      whole = [e for e in entries if not e.get("resumed_from_step")]
      scores.finetune_spent += [Spent(e.get("minutes") or 0.0, e.get("cpu_minutes")) for e in whole]
      scores.distillation = self.log.distillation_spent(model.key)
      # each result as it is done: the suite is long
      logging.warning("bench students: %s %s %s", name, t.label, json.dumps(scores.row([t.label])))
    return scores

  def _ensemble(self, name: str, tasks: list) -> ModelScores:
    """Row `name` of ENSEMBLES: the dev score of the mean logits of the teacher's first runs, one
    value a task (the runs are the teacher row's seeds: nothing here is random)."""
    model, scores = self.model("teacher"), ModelScores(name, "teacher", 0)
    for t in tasks:
      entry = model.measured(t, name, partial(self._ensemble_score, task=t, count=ENSEMBLES[name]))
      scores.finetuned[t.label] = [] if entry is None else [entry["value"]]
      scores.finetuned_missing += entry is None
      logging.warning("bench students: %s %s %s", name, t.label, json.dumps(scores.row([t.label])))
    return scores

  def _run_dir(self, name: str, model: _Model, t: BenchTask, seed: int) -> str:
    """The workdir of row `name`'s fine-tuning of `model` on `t` with `seed`: named by what its
    score depends on, beside the models (in `tmp` without a results file)."""
    key = {**model.key, "task": f"{t.name}={t.data_dir}", "seed": seed}
    return self.log.model_dir(self.tmp, f"{name}_{t.label}_{seed}", key)

  def _ensemble_score(self, init: str, task: BenchTask, count: int) -> float:
    """The dev score (the task's first metric) of the mean logits of the teacher runs of seeds 0 to
    `count` - 1, each run's logits cached as the second stages' are."""
    dev = task.task.load("dev", task.data_dir)
    cache_dir, length = self.log.cache_dir(self.tmp), self.settings.length
    logits = [
      teacher_logits(
        find_teachers([path], [task.task])[task.task.name], task.task, dev, length, 64, self.mesh, cache_dir
      )
      for path in self.teacher_runs(task, count).split(",")
    ]
    return task.task.score(task.task.predict(np.mean(logits, axis=0)), dev)[task.task.metrics[0]]

  def _fine_tuning(self, name: str, t: BenchTask, epochs: int, seed: int, run_dir: str) -> Callable[[str], float]:
    """How row `name` is fine-tuned on `t` for `epochs` with `seed` in `run_dir`, given its model's
    path: on the gold labels, distilling the task's teacher run (a second stage, whose teacher is
    fine-tuned only when one is measured), or, for the teacher's seed 0, read from that kept teacher
    run."""
    s, spec = self.settings, TWO_STAGE.get(name, {})
    fine_tuning = _FineTuning(t, seed, epochs, s.length, s.finetune_lr, run_dir, RESUME_EVERY)
    if spec and "steps_of" not in spec:
      copies = spec.get("copies", 1)
      distill = {
        "distill.layers": spec["layers"],
        "augment.enabled": spec["augment"],
        "augment.size_factor": copies * s.size_factor,
        "augment.n_iter": copies * finetune_config().augment.n_iter,
        "distill.cache_dir": self.log.cache_dir(self.tmp),
      }
      teacher_runs = partial(self.teacher_runs, t, spec.get("teachers", 1))
      return partial(_second_stage, fine_tuning=fine_tuning, distill=distill, teacher_run=teacher_runs, mesh=self.mesh)
    if name == "teacher":  # the runs the second stages learn from, kept
      return partial(_teacher_score, teacher_run=partial(self.teacher_run, t, seed), task=t)
    return partial(fine_tuning.score, mesh=self.mesh)


def _saved_step(run_dir: str) -> int:
  """The step of `run_dir`'s latest checkpoint: where a fine-tuning stopped part way resumes (0: none)."""
  if not run_dir or not runs.is_run(run_dir):
    return 0
  return runs.RunCheckpoints(run_dir, read_only=True).latest_step() or 0


def _second_stage(init: str, fine_tuning: _FineTuning, distill: dict, teacher_run: Callable[[], str], mesh) -> float:
  """`fine_tuning` of `init` distilling the teacher run (or comma list of runs) `teacher_run()` with
  the `distill` settings."""
  second = dataclasses.replace(fine_tuning, distill={**distill, "distill.teacher": teacher_run()})
  return second.score(init, mesh)


def _teacher_score(init: str, teacher_run: Callable[[], str], task: BenchTask) -> float:
  """The last epoch's dev score of the kept teacher run (its results.json)."""
  with open(os.path.join(teacher_run(), "results.json")) as f:
    return json.load(f)[selection_metric(task.task)]
