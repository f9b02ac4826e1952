"""Orbax checkpoints of a run: the train state, the data-stream position and the run's record.

A workdir holds `checkpoints/<step>/{state,data,meta,checksums}` (`meta`: the run's `RunRecord`;
`checksums`: a CRC-32 of each array of the state, checked whenever the state is read). Saves are
asynchronous (the arrays are copied to host before `save` returns, so the state can be donated
right after). Orbax writes each step to a temporary directory and renames it when complete, so an
interrupted save never shadows the previous checkpoint.
"""

import glob
import hashlib
import logging
import os
import shutil
import sys
import time
import traceback
import warnings
import zlib
from typing import NoReturn

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from minilm_jax.data.files import tree_digest
from minilm_jax.errors import STORAGE_ERRNOS, StorageError, UserError
from minilm_jax.runs.record import RunRecord

ITEMS = ("state", "data", "meta", "checksums")


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def is_run(path: str) -> bool:
  """Whether `path` is the workdir of a run of ours (as opposed to a Hugging Face directory)."""
  return os.path.isdir(checkpoint_dir(path))


def step_digest(workdir: str, step: int, *more_dirs: str) -> str:
  """A digest of what checkpoint `step` of the run at `workdir` holds (every file under it, by its
  path in the step and its bytes) and of the folders `more_dirs` (its tokenizer): what a cache of
  something the run computes is keyed by, so that a run rebuilt at the same path is not taken for
  the one before it."""
  return tree_digest(os.path.join(checkpoint_dir(workdir), str(step)), *more_dirs)


def weights_digest(params) -> str:
  """A digest of a model's parameters as read (each array's path, dtype, shape and bytes): what a
  run keeps of its teacher, so that a resume finds out whether the teacher at its path is still the
  one it started from."""
  digest = hashlib.sha256()
  for path, value in sorted(jax.tree_util.tree_flatten_with_path(params)[0], key=lambda p: jax.tree_util.keystr(p[0])):
    array = np.ascontiguousarray(jax.device_get(value))
    digest.update(f"{jax.tree_util.keystr(path)}\0{array.dtype}\0{array.shape}\0".encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def _array_name(path) -> str:
  """An array's place in a state, the same whether the state is read whole (a `TrainState`'s
  attributes) or in part (`{"params": ...}`): its keys joined by "/"."""
  return "/".join(str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path)


def _on_host(value) -> np.ndarray | None:
  """`value` whole as a numpy array, or None where this process holds only a part of it (an array
  sharded across the processes of a multi-host run)."""
  if not isinstance(value, jax.Array):
    return np.asarray(value)
  if value.is_fully_addressable:
    return np.asarray(jax.device_get(value))
  shards = {repr(shard.index): shard for shard in value.addressable_shards}  # one of each replica
  if sum(shard.data.size for shard in shards.values()) != value.size:
    return None
  whole = np.empty(value.shape, value.dtype)
  for shard in shards.values():
    whole[shard.index] = np.asarray(shard.data)
  return whole


def state_checksums(state) -> dict:
  """{array name: [dtype, shape, CRC-32 of its bytes]} for every array of `state` this process
  holds whole. Saved with each checkpoint and compared after each read: a data file damaged in
  place (a lost line, a flipped byte) can read back as other numbers without any error, because
  the chunk of an array whose values zstd cannot compress is stored as it is, and Orbax gives the
  chunks no checksum of their own."""
  out = {}
  for path, value in jax.tree_util.tree_flatten_with_path(state)[0]:
    array = _on_host(value)
    if array is not None:
      array = np.asarray(array, order="C")  # (np.ascontiguousarray makes a scalar an array of one)
      crc = zlib.crc32(array.reshape(-1).view(np.uint8).data)  # bytes of any dtype, bfloat16's too
      out[_array_name(path)] = [str(array.dtype), list(array.shape), crc]
  return out


class DamagedArray(Exception):
  """An array read back differs from the array saved (`_restore_intact` reads around it)."""


def _check_state(state, saved: dict):
  """Raises `DamagedArray` on the first array of `state` whose bytes are not those `saved`
  (`state_checksums` of the state as written); arrays read at another dtype or shape go unchecked."""
  for name, (dtype, shape, crc) in state_checksums(state).items():
    expected = saved.get(name)
    if expected is not None and expected[:2] == [dtype, shape] and expected[2] != crc:
      raise DamagedArray(f"the array {name} reads back other than it was saved (its CRC-32 differs)")


# Orbax's warnings about what `RunCheckpoints` reads around and reports itself: a directory opened
# read-only (to export or evaluate a run), and the step a killed save left without its metadata
# (set aside when the run resumes, with the one line of the lock's takeover before it).
_ORBAX_WARNINGS_LEFT_OUT = ("Given directory is read only", "Metadata file does not exist")


class _NotAnOrbaxError(logging.Filter):
  """Lets through every record but Orbax's ERROR records and the warnings of
  `_ORBAX_WARNINGS_LEFT_OUT` (installed once per process, `quiet_orbax_failure_reports`)."""

  def filter(self, record):
    if f"{os.sep}orbax{os.sep}" not in record.pathname:
      return True
    return record.levelno < logging.ERROR and not record.getMessage().startswith(_ORBAX_WARNINGS_LEFT_OUT)


def quiet_orbax_failure_reports():
  """Called once by every program as it starts (`program.run_program`). A failed asynchronous save
  (a full disk) is reported by Orbax's threads many times over, with tracebacks: hundreds of
  lines. Every such failure also reaches `RunCheckpoints` (through `check_for_errors`, or as the
  exception of a restore), which reports it as one line, so these are left out: Orbax's ERROR log
  records; its warnings that a directory we open read-only (to export or evaluate a run) is
  read-only and that a step a killed save left has no metadata; asyncio's reports of write tasks
  whose exception nobody retrieved; as the save unwinds, the TensorStore callbacks that find the
  event loop closed; and, after a restore of a damaged checkpoint fails, its other reads (Orbax's
  coroutines, each holding the failure and a 60-line TensorStore spec; 3,137 lines for one
  truncated file) as Python collects them. Python reports those last two as unraisable; and, as
  the interpreter ends after a failed save, the warning that one of the save's write coroutines
  (jax's array serialisation, under Orbax) never ran."""
  absl_logger = logging.getLogger("absl")  # absl.logging's records, which Orbax writes through
  if any(isinstance(f, _NotAnOrbaxError) for f in absl_logger.filters):
    return

  def not_an_orbax_task(record):
    """A task's report names its coroutine (Orbax's) in the message; a future's in its traceback, or in its
    exception's text where it has none."""
    if "exception was never retrieved" not in record.getMessage():
      return True
    where = record.getMessage()
    if record.exc_info and record.exc_info[2] is not None:
      where += "".join(traceback.format_tb(record.exc_info[2]))
    # A future's exception may name neither: TensorStore's read of Orbax's OCDBT files names the database.
    return f"{os.sep}orbax{os.sep}" not in where and "orbax" not in where and "OCDBT database" not in where

  warnings.filterwarnings("ignore", message="coroutine 'async_serialize_from_host.*' was never awaited")
  absl_logger.addFilter(_NotAnOrbaxError())
  logging.getLogger("asyncio").addFilter(not_an_orbax_task)
  previous_hook = sys.unraisablehook

  def hook(unraisable):
    closed_loop = isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value)
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine's
    orbax_read = code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename
    if not (closed_loop or orbax_read):
      previous_hook(unraisable)

  sys.unraisablehook = hook


# The damaged-checkpoint warnings this process has printed (and whether by a reader): each once.
_WARNED: set[tuple[str, bool]] = set()


class RunCheckpoints:
  """A run's checkpoints: the newest `keep` steps, and with `best` = (metric, higher is better) also
  the step whose saved metrics scored best on that metric (Orbax's preservation policies)."""

  def __init__(self, workdir: str, every: int = 1, keep: int = 3, read_only: bool = False, best=None):
    if read_only:
      options = ocp.CheckpointManagerOptions(
        read_only=True, enable_async_checkpointing=False, create=False, save_interval_steps=0
      )
    elif best:
      metric, higher = best
      policies = ocp.checkpoint_managers
      options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(
          [
            policies.LatestN(n=keep),
            # BestN sorts ascending and keeps the last n: reversed, the lowest comes last.
            policies.BestN(
              get_metric_fn=lambda m: m[metric], reverse=not higher, n=1, keep_checkpoints_without_metrics=False
            ),
          ]
        )
      )
    else:
      options = ocp.CheckpointManagerOptions(max_to_keep=keep)
    self._best = best
    self.every, self.read_only = every, read_only
    self._failure: str | None = None
    self.manager = ocp.CheckpointManager(checkpoint_dir(workdir), item_names=ITEMS, options=options)

  def latest_step(self):
    return self.manager.latest_step()

  def due(self, step: int) -> bool:
    """Whether the periodic schedule saves `step` (the training loop also saves the last step)."""
    return step % self.every == 0

  def ranks(self, metrics) -> bool:
    """Whether `metrics` hold the one that picks the best step (so that their step must be saved)."""
    return self._ranking(metrics) is not None

  def _ranking(self, metrics: dict | None) -> dict | None:
    """What Orbax ranks a step by: {metric: value} of `best`'s metric, if `metrics` hold it."""
    if self._best and metrics and self._best[0] in metrics:
      return {self._best[0]: float(metrics[self._best[0]])}
    return None

  def save(self, step: int, state, data_position: dict, record: RunRecord, metrics: dict | None = None) -> bool:
    """Saves `step` now (asynchronously); the caller decides when (`due`, the last step, a preemption).
    `metrics` (the step's evaluations) rank it for `best`; a step saved without them is kept only
    while it is among the newest."""
    self.check()
    try:
      return self.manager.save(
        step,
        metrics=self._ranking(metrics),
        force=True,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_position),
          meta=ocp.args.JsonSave(record.to_json()),
          checksums=ocp.args.JsonSave(state_checksums(state)),
        ),
      )
    except Exception as e:  # storage errors come as OSError, ValueError(RESOURCE_EXHAUSTED), ...
      self._failed(e)

  def check(self):
    """Stops the run with one line as soon as an asynchronous save has failed (the training loop
    asks every step), instead of at the next save."""
    if self._failure is None:
      try:
        self.manager.check_for_errors()
      except Exception as e:
        self._failed(e)

  def _failed(self, error: Exception) -> NoReturn:
    """Removes the partial directory of the failed save (the earlier checkpoints stay) and raises
    one line: where, what failed, and the free space there."""
    directory = str(self.manager.directory)
    self._failure = str(error)
    try:  # let the save's other threads end first, or they write into the directory removed below
      self.manager.wait_until_finished()
    except Exception:  # the same failure, reported again
      pass
    _remove_partial_saves(directory)
    usage = shutil.disk_usage(directory)
    # The directory's finished steps: the manager's own list can be out of date after a failure.
    saved = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    kept = f"The checkpoints saved before (steps {saved}) are kept" if saved else "No checkpoint was saved before"
    reason = _storage_reason(error)
    self._failure = (
      f"saving a checkpoint in {directory} failed ({reason}); {usage.free / 2**20:.1f} MiB of "
      f"{usage.total / 2**20:.1f} MiB free there. {kept}: free space and rerun the same command to resume"
    )
    raise StorageError(self._failure, reason) from None

  def read_record(self, step=None) -> RunRecord:
    """The run's record at `step` (default: the newest step whose record can be read back)."""
    return self.read_step_and_record(step)[1]

  def read_step_and_record(self, step=None) -> tuple[int, RunRecord]:
    """(the step read, the run's record there): `step`, or the newest step whose record can be read."""
    read = {}

    def restore(s):
      read["step"] = s
      return self.manager.restore(s, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))

    record = RunRecord.from_json(self._restore_intact(step, restore).meta)
    return read["step"], record

  def restore(self, abstract_state, step=None):
    """(state, data position, record) of `step` (default: the newest that can be read), placed as
    `abstract_state`'s shardings say."""
    out = self._restore_intact(
      step,
      lambda s: self._restore_checked(
        s, state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()
      ),
    )
    return out.state, out.data, RunRecord.from_json(out.meta)

  def restore_params(self, abstract_params, step=None):
    """Only the parameters of a saved train state (a teacher needs no optimizer state)."""
    target = {"params": abstract_params}
    out = self._restore_intact(
      step,
      lambda s: self._restore_checked(
        s,
        state=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        ),
      ),
    )
    return out.state["params"]

  def _restore_checked(self, step: int, **items):
    """The `items` of `step`, its state compared with the checksums saved with it (the checkpoints
    written before checksums have none to compare)."""
    checked = (self.manager.directory / str(step) / "checksums").is_dir()
    if checked:
      items["checksums"] = ocp.args.JsonRestore()
    out = self.manager.restore(step, args=ocp.args.Composite(**items))
    if checked:
      _check_state(out.state, out.checksums)
    return out

  def _restore_intact(self, step, restore):
    """`restore(step)`; without a step, of the newest step whose files can be read back. A newer
    one that cannot (a file cut short by a crash or a full disk) is named in a warning and, when
    this manager writes, moved to `<workdir>/damaged_checkpoints/` so that the run can save that
    step again; it is never deleted."""
    if step is not None:
      step = self._step(step)
      try:
        return restore(step)
      except Exception as e:  # Orbax and TensorStore raise many types for a damaged file
        raise UserError(
          f"the checkpoint of step {step} in {self.manager.directory} cannot be read ({_brief(e)}): "
          f"choose another step (steps there: {list(self.manager.all_steps())})"
        ) from None
    steps = sorted(self.manager.all_steps(), reverse=True)
    self._step(None)  # one line when there is none
    damaged = []
    for candidate in steps:
      try:
        out = restore(candidate)
      except Exception as e:
        damaged.append((candidate, e))
        continue
      if damaged:
        warning = (
          f"warning: the checkpoint of step {damaged[0][0]} in {self.manager.directory} cannot be read "
          f"({_brief(damaged[0][1])}); using step {candidate}, the newest that can"
        )
        # Said once per reader or writer: reading the metadata, then the state, finds the same damage.
        if (warning, self.read_only) not in _WARNED:
          _WARNED.add((warning, self.read_only))
          print(warning, file=sys.stderr)
        self._set_aside([s for s, _ in damaged])
      return out
    raise UserError(
      f"no checkpoint in {self.manager.directory} can be read (steps {steps}; the newest: "
      f"{_brief(damaged[0][1])}): start a new --workdir"
    )

  def _set_aside(self, steps):
    if self.read_only:
      return
    if jax.process_index() == 0:
      directory = str(self.manager.directory)
      aside = os.path.join(os.path.dirname(directory), "damaged_checkpoints")
      os.makedirs(aside, exist_ok=True)
      for step in steps:
        shutil.move(os.path.join(directory, str(step)), os.path.join(aside, str(step)))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("minilm_jax: damaged checkpoints set aside")
    self.manager.reload()

  def _step(self, step):
    step = self.latest_step() if step is None else step
    if step is None or step not in self.manager.all_steps():
      raise UserError(
        f"no complete checkpoint{'' if step is None else f' at step {step}'} in {self.manager.directory}: "
        f"steps there are {list(self.manager.all_steps())}"
      )
    return step

  def wait(self):
    if self._failure is not None:  # already reported; the manager's threads have nothing left to finish
      return
    try:
      self.manager.wait_until_finished()
    except Exception as e:
      self._failed(e)

  def close(self):
    self.manager.close()


def _remove_partial_saves(directory: str):
  """Removes the temporary directories of a failed save. TensorStore writes still in flight when
  Orbax gave up can recreate one for a moment on a loaded machine, so removal repeats until the
  directory stays away (a few seconds at most)."""
  for _ in range(20):
    partials = glob.glob(os.path.join(directory, "*.orbax-checkpoint-tmp*"))
    if not partials:
      return
    for partial in partials:
      shutil.rmtree(partial, ignore_errors=True)
    time.sleep(0.25)


def _storage_reason(error: Exception) -> str:
  """The OS's words for a failed write (TensorStore buries them deep in a long message), else the error."""
  text = str(error)
  for reason in map(os.strerror, STORAGE_ERRNOS):
    if reason in text:
      return reason
  return _brief(error)


def _brief(error: Exception) -> str:
  # Orbax's read errors go on with "See full TensorStore details: <bound method ...>", not details.
  text = str(error).split(" See full TensorStore details")[0]
  return f"{type(error).__name__}: {' '.join(text.split())[:160]}"
