"""The `students` suite's scores: a model's fine-tuned and frozen-probe scores per task, the errors
of the differences between two models (over seeds when fine-tuned; paired by example, McNemar's view,
when probed frozen), and the rows that rank the models and say which are within noise of each other."""

import dataclasses
from typing import Any

import numpy as np

from minilm_jax.benchmarks.students.log import Spent

# The rows that are not distilled: the teacher, and what a user gets without distillation (the
# teacher's first or evenly spaced layers, a random student of the same shape). Every other row is a
# distilled student, whose share of the gap from the better layer-dropping baseline is reported.
BASELINES = ("teacher", "first_layers", "uniform_layers", "random")


@dataclasses.dataclass
class ModelScores:
  """One model's dev scores: fine-tuned per task and seed, frozen probe per task."""

  model: str
  student: str
  distill_tokens: int
  distillation: Spent = Spent()
  finetune_spent: list[Spent] = dataclasses.field(default_factory=list)  # each fine-tuning's (second stages: theirs)
  finetuned: dict[str, list] = dataclasses.field(default_factory=dict)  # task -> score per seed
  finetuned_missing: int = 0  # fine-tunings (task x seed) a log-only view lacks
  # task -> whether the frozen probe gets each dev example right (None: a sentence-pair task, no probe)
  probe: dict[str, np.ndarray | None] = dataclasses.field(default_factory=dict)

  def finetuned_mean(self) -> float | None:
    """The mean over tasks of the mean over seeds (None without fine-tuning, or with some missing)."""
    if self.finetuned_missing or not all(self.finetuned.values()):
      return None
    return float(np.mean(list(self.finetuned.values())))

  def per_seed_mean(self) -> np.ndarray:
    """Each seed's fine-tuned mean over tasks."""
    return np.mean(list(self.finetuned.values()), axis=0)

  def finetuned_error(self) -> float:
    """The standard error of `finetuned_mean`: of `per_seed_mean` across seeds (NaN, unknown, from
    one seed)."""
    per_seed_mean = self.per_seed_mean()
    return _standard_error(per_seed_mean) if len(per_seed_mean) > 1 else float("nan")

  def probe_mean(self) -> float | None:
    """The mean over the probed tasks of the probe's dev accuracy (None when no task is probed)."""
    probed = [correct.mean() for correct in self.probe.values() if correct is not None]
    return float(np.mean(probed)) if probed else None

  def row(self, tasks) -> dict:
    row: dict[str, Any] = {"model": self.model, "student": self.student, "distill_tokens": self.distill_tokens}
    row["distill_min"] = round(self.distillation.minutes, 1)
    if self.distillation.cpu_minutes is not None:
      row["distill_cpu_min"] = round(self.distillation.cpu_minutes, 1)
    if self.finetune_spent:
      row["ft_min"] = round(float(np.mean([s.minutes for s in self.finetune_spent])), 2)
      cpu = [s.cpu_minutes for s in self.finetune_spent if s.cpu_minutes is not None]
      if len(cpu) == len(self.finetune_spent):  # every fine-tuning's: a mean of some would compare other runs
        row["ft_cpu_min"] = round(float(np.mean(cpu)), 2)
    if self.finetuned_missing:
      row["ft_missing"] = self.finetuned_missing
    for t in tasks:
      if self.finetuned.get(t):
        row[f"{t}/ft"] = round(float(np.mean(self.finetuned[t])), 4)
        row[f"{t}/ft_std"] = round(_std(self.finetuned[t]), 4)
      if t in self.probe:
        correct = self.probe[t]
        row[f"{t}/probe"] = None if correct is None else round(float(correct.mean()), 4)
    if len(self.finetuned) == len(tasks) and self.finetuned_mean() is not None:
      per_seed_mean = self.per_seed_mean()
      row["mean/ft"], row["mean/ft_std"] = round(float(per_seed_mean.mean()), 4), round(_std(per_seed_mean), 4)
    probe_mean = self.probe_mean()
    if len(self.probe) == len(tasks) and probe_mean is not None:
      row["mean/probe"] = round(probe_mean, 4)
    return row


def _std(values) -> float:
  return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _standard_error(values) -> float:
  return _std(values) / np.sqrt(len(values))


def finetuned_difference_error(a: ModelScores, b: ModelScores) -> float:
  """Standard error of the difference of two models' fine-tuned means over tasks: their seeds are
  independent runs (NaN, unknown, when either has one seed)."""
  return float(np.hypot(a.finetuned_error(), b.finetuned_error()))


def probe_difference_error(a: ModelScores, b: ModelScores) -> float:
  """Standard error of the difference of two models' probe means over tasks, paired by dev example:
  per task, the variance of the per-example difference of correctness (-1, 0 or 1) over the dev
  set's size; the tasks' dev sets are independent, and the mean over tasks divides by their number."""
  pairs = [(mine, b.probe[t]) for t, mine in a.probe.items() if mine is not None]
  variances = [np.var(mine.astype(float) - theirs, ddof=1) / len(mine) for mine, theirs in pairs]
  return float(np.sqrt(sum(variances)) / len(pairs))


def rank(models: list, tasks: list) -> list:
  """Rows of `models` with each one's rank by the mean over tasks (fine-tuned and probed), the share
  of the gap from the better layer-dropping baseline to the teacher that it closes, and the models
  it is within noise of (means closer than twice the standard error of their difference)."""
  rows = [m.row(tasks) for m in models]
  kinds = (
    ("ft", ModelScores.finetuned_mean, finetuned_difference_error),
    ("probe", ModelScores.probe_mean, probe_difference_error),
  )
  for kind, mean_of, difference_error in kinds:
    means: dict[str, float] = {}
    for m in models:
      mean = mean_of(m)
      if mean is not None:
        means[m.model] = mean
    scored = {m.model: m for m in models if m.model in means}
    order = sorted(means, key=lambda name: -means[name])
    baselines = [means[b] for b in ("first_layers", "uniform_layers") if b in means]
    for row in rows:
      name = row["model"]
      if name not in means:
        continue
      row[f"{kind}_rank"] = order.index(name) + 1
      if baselines and "teacher" in means and name not in BASELINES:
        gap = means["teacher"] - max(baselines)
        row[f"{kind}_gap_closed"] = round((means[name] - max(baselines)) / gap, 2) if gap > 0 else None
      # NaN: one of the two has one seed, no spread to compare against, so no claim either way
      errors = {o: difference_error(scored[name], scored[o]) for o in order if o != name}
      unknown = [o for o, e in errors.items() if np.isnan(e)]
      ties = [o for o, e in errors.items() if abs(means[name] - means[o]) < 2 * e]
      if np.isnan(difference_error(scored[name], scored[name])):  # its own error is unknown
        row[f"{kind}_within_noise_of"] = "unknown (one seed)"
      else:
        row[f"{kind}_within_noise_of"] = (",".join(ties) or "-") + (
          f"; unknown (one seed): {','.join(unknown)}" if unknown else ""
        )
  return rows
