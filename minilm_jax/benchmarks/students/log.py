"""The `students` suite's measurements (a probe's correct examples, a fine-tuning seed's score), kept
by what determines them in a JSON Lines file, so that a suite of hours that stops resumes from it,
and its distilled models and caches kept beside that file. The inputs a measurement depends on are
named in its key by what they hold, not where they lie (`ByContent`)."""

import copy
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time

from minilm_jax.data.corpus import BUILT_IN
from minilm_jax.data.files import tree_digest, written_whole
from minilm_jax.errors import UserError

# How a key names an input by its content: the sha256 of its files (`files.tree_digest`).
CONTENT = "sha256:"


@dataclasses.dataclass(frozen=True)
class Spent:
  """How long a measurement or a distillation took, in minutes: wall-clock, and this process's CPU
  time (all its threads; None in entries logged before it was), which stays comparable when the suite
  shared its machine at low priority and its wall-clock minutes did not."""

  minutes: float = 0.0
  cpu_minutes: float | None = None

  @staticmethod
  def clock() -> tuple:
    return time.perf_counter(), time.process_time()

  @classmethod
  def since(cls, started: tuple) -> "Spent":
    wall, cpu = started
    return cls((time.perf_counter() - wall) / 60, (time.process_time() - cpu) / 60)


def distilled_of(model_key: dict) -> dict:
  """What a model's distillation depends on: its key without the fine-tuning and second-stage
  settings."""
  return {k: model_key[k] for k in ("distill", "teacher")}


class ByContent:
  """The inputs a suite's key names by path (the teacher, the distillation corpus, a task's data),
  named by what they hold instead: another checkout or venv holding the same teacher finds its
  measurements, and another teacher put at the same path does not. Each path is digested once."""

  def __init__(self):
    self.digests: dict[str, str] = {}

  def named(self, value):
    """`value` (a path, or a comma list of paths) as "sha256:<digest of their files>" where each is
    on this machine; else as given: a hub name, a built-in corpus, a folder this machine lacks, a
    value already named by content."""
    if not isinstance(value, str) or not value or value.startswith(CONTENT) or value in BUILT_IN:
      return value
    paths = [p.strip() for p in value.split(",")]
    if not all(os.path.exists(p) for p in paths):
      return value
    if value not in self.digests:
      self.digests[value] = CONTENT + tree_digest(*paths)
    return self.digests[value]

  def key(self, key):
    """`key` with its inputs named by content: a model's ({"distill": its config or None, "teacher",
    ...}, and a run folder's "task"), or a measurement's ([the model's, "<task>=<data>", what])."""
    if isinstance(key, list | tuple):
      model, task, *what = key
      return [self.key(model), self._task(task), *what]
    key = copy.deepcopy(key)
    distill = key.get("distill") or {}
    for block, field in ((key, "teacher"), (distill.get("teacher", {}), "path"), (distill.get("data", {}), "corpus")):
      if field in block:
        block[field] = self.named(block[field])
    if "task" in key:
      key["task"] = self._task(key["task"])
    return key

  def _task(self, task: str) -> str:
    name, _, data = task.partition("=")
    return f"{name}={self.named(data)}" if data else task


class MeasurementLog:
  """Measurements (which dev examples a probe gets right, a fine-tuning seed's score) by what determines
  them, kept in a JSON Lines file when given one: a suite of hours that stops resumes from it."""

  def __init__(self, path: str):
    self.path, self.entries, self.by_content = path, dict[str, dict](), ByContent()
    if path and os.path.isdir(path):
      raise UserError(f"--results {path} is a folder: name a JSON Lines file, a new one or one this suite wrote")
    if path and os.path.exists(path):
      renamed = 0
      with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
          try:  # bytes that are not UTF-8 are a ValueError too
            entry = json.loads(line.decode("utf-8"))
            key = self._key(json.loads(entry["key"]))
          except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{path}:{number} is not a line this suite wrote: pass another --results file") from None
          renamed += key != entry["key"]
          self.entries[key] = {**entry, "key": key}
      if renamed:
        self._rewrite_by_content(renamed)

  def _key(self, key) -> str:
    return json.dumps(self.by_content.key(key), sort_keys=True)

  def _rewrite_by_content(self, renamed: int):
    """Writes the file again with each entry's inputs named by content: entries logged when keys
    named them by path (earlier versions), taken as measured on what those paths hold now, once.
    The file as it was is kept beside it."""
    stem, extension = os.path.splitext(self.path)
    kept = f"{stem}.by_path{extension}"
    if not os.path.exists(kept):
      shutil.copyfile(self.path, kept)
    with written_whole(self.path) as pending, open(pending, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(entry) + "\n" for entry in self.entries.values())
    logging.warning(
      "bench students: %d measurements in %s named their teacher, corpus or task data by path: they are now "
      "named by what those paths hold (the file as it was: %s)",
      renamed,
      self.path,
      kept,
    )

  def model_dir(self, tmp: str, name: str, distilled: dict) -> str:
    """Where a model is distilled, or a run fine-tuned, named by the settings `distilled` it depends
    on (its inputs by content): beside the log when there is one (a rerun finds it done, or resumes
    it), else in `tmp`. A folder an earlier version named by the inputs' paths is renamed to it."""
    if not self.path:
      return os.path.join(tmp, name)
    folder = os.path.join(f"{os.path.splitext(self.path)[0]}_models", name + "_{}")
    path = folder.format(hashlib.sha256(self._key(distilled).encode()).hexdigest()[:12])
    by_path = folder.format(hashlib.sha256(json.dumps(distilled, sort_keys=True).encode()).hexdigest()[:12])
    if not os.path.exists(path) and os.path.isdir(by_path):
      os.rename(by_path, path)
    return path

  def cache_dir(self, tmp: str) -> str:
    """Where the second stages' teacher logits and augmented sets are cached: beside the models."""
    return os.path.join(f"{os.path.splitext(self.path)[0]}_models" if self.path else tmp, "cache")

  def say_if_none_match(self, model_keys: list, logged_only: bool = False):
    """One warning line when the file holds measurements and none is of the models `model_keys`
    (each `_Model.key`): a file of another version's settings, or of other flags, whose rows are
    all measured again (and appended) rather than read. With `logged_only`, which measures nothing,
    one line and exit 2 for that, and for a file that holds nothing."""
    if logged_only and not self.entries:
      raise UserError(f"--logged_only: {self.path} holds no measurements: check the --results path")
    if not self.entries:
      return
    wanted = {self._key(k) for k in model_keys}
    if not any(self._key(json.loads(key)[0]) in wanted for key in self.entries):
      if logged_only:
        raise UserError(
          f"--logged_only: none of the {len(self.entries)} measurements in {self.path} is of these models and "
          f"settings (another version's file, or other flags): run without --logged_only to measure them"
        )
      logging.warning(
        "bench students: none of the %d measurements in %s is of these models and settings (another version's "
        "file, or other flags): every row is measured again and appended to it",
        len(self.entries),
        self.path,
      )

  def __contains__(self, key) -> bool:
    return self._key(key) in self.entries

  def __getitem__(self, key) -> dict:
    return self.entries[self._key(key)]

  def distillation_spent(self, model_key) -> Spent:
    """How long the model's distillation took: the longest time logged with any measurement of the
    same distilled model (the run that distilled it logs the whole time; a later run finds it
    distilled and takes moments), whichever row measured it: a second stage's first stage may
    have been distilled by the `+long` row's run, or the reverse."""
    model = self._key(distilled_of(model_key))
    same = [e for k, e in self.entries.items() if self._key(distilled_of(json.loads(k)[0])) == model]
    cpu = [e["distill_cpu_minutes"] for e in same if e.get("distill_cpu_minutes") is not None]
    return Spent(max((e["distill_minutes"] for e in same), default=0.0), max(cpu, default=None))

  def add(self, key, value, distillation: Spent, spent: Spent | None = None, resumed_from_step: int = 0):
    """`spent`: how long the measurement took (a fine-tuning's; with `resumed_from_step`, the part
    after the checkpoint of that step that a stopped run left); `distillation`: its model's."""
    entry = {"key": self._key(key), "value": value, "distill_minutes": distillation.minutes}
    entry.update({"distill_cpu_minutes": distillation.cpu_minutes} if distillation.cpu_minutes is not None else {})
    entry["minutes"] = None if spent is None else spent.minutes
    entry.update({"cpu_minutes": spent.cpu_minutes} if spent is not None else {})
    entry.update({"resumed_from_step": resumed_from_step} if resumed_from_step else {})
    self.entries[entry["key"]] = entry
    if self.path:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
