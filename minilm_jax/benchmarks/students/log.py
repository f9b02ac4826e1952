"""The `students` suite's measurements (a probe's correct examples, a fine-tuning seed's score), kept
by what determines them in a JSON Lines file, so that a suite of hours that stops resumes from it,
and its distilled models and caches kept beside that file."""

import hashlib
import json
import logging
import os

from minilm_jax.errors import UserError


def distilled_of(model_key: dict) -> dict:
  """What a model's distillation depends on: its key without the fine-tuning and second-stage
  settings."""
  return {k: model_key[k] for k in ("distill", "teacher")}


class MeasurementLog:
  """Measurements (which dev examples a probe gets right, a fine-tuning seed's score) by what determines
  them, kept in a JSON Lines file when given one: a suite of hours that stops resumes from it."""

  def __init__(self, path: str):
    self.path, self.entries = path, dict[str, dict]()
    if path and os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
          try:
            entry = json.loads(line)
            self.entries[entry["key"]] = entry
          except (ValueError, KeyError, TypeError):
            raise UserError(f"{path}:{number} is not a line this suite wrote: pass another --results file") from None

  @staticmethod
  def _key(key) -> str:
    return json.dumps(key, sort_keys=True)

  def model_dir(self, tmp: str, name: str, distilled: dict) -> str:
    """Where a model is distilled (named by its distillation settings): beside the log when there
    is one (a rerun finds it done, and its later seeds need no distillation again), else in `tmp`."""
    if not self.path:
      return os.path.join(tmp, name)
    digest = hashlib.sha256(self._key(distilled).encode()).hexdigest()[:12]
    return os.path.join(f"{os.path.splitext(self.path)[0]}_models", f"{name}_{digest}")

  def cache_dir(self, tmp: str) -> str:
    """Where the second stages' teacher logits and augmented sets are cached: beside the models."""
    return os.path.join(f"{os.path.splitext(self.path)[0]}_models" if self.path else tmp, "cache")

  def say_if_none_match(self, model_keys: list):
    """One warning line when the file holds measurements and none is of the models `model_keys`
    (each `_Model.key`): a file of another version's settings, or of other flags, whose rows are
    all measured again (and appended) rather than read."""
    if not self.entries:
      return
    wanted = {self._key(k) for k in model_keys}
    if not any(self._key(json.loads(key)[0]) in wanted for key in self.entries):
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

  def distill_minutes(self, model_key) -> float:
    """How long the model's distillation took: the longest time logged with any measurement of the
    same distilled model (the run that distilled it logs the whole time; a later run finds it
    distilled and takes moments), whichever row measured it: a second stage's first stage may
    have been distilled by the `+long` row's run, or the reverse."""
    model = self._key(distilled_of(model_key))
    times = [
      e["distill_minutes"] for k, e in self.entries.items() if self._key(distilled_of(json.loads(k)[0])) == model
    ]
    return max(times, default=0.0)

  def add(self, key, value, distill_minutes: float, minutes: float | None = None):
    """`minutes`: how long the measurement took (a fine-tuning's)."""
    entry = {"key": self._key(key), "value": value, "distill_minutes": distill_minutes, "minutes": minutes}
    self.entries[entry["key"]] = entry
    if self.path:
      with open(self.path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
