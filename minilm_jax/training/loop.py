"""The training loop shared by distillation and fine-tuning: batches from a resumable stream,
prefetched onto the devices, progress bar, metrics, a stop at a non-finite update, periodic and
SIGTERM checkpoints; and the checks every training program runs before it starts (`begin_run`)."""

import dataclasses
import json
import math
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import jax
from flax import traverse_util
from tqdm import tqdm

from minilm_jax.devices import parallel
from minilm_jax.devices.distributed import check_same_config, config_json, host_scalars
from minilm_jax.errors import Preempted, UserError
from minilm_jax.kernels import dropout as dropout_bits
from minilm_jax.runs import lock
from minilm_jax.runs.checkpoints import RunCheckpoints, is_run
from minilm_jax.runs.record import RunRecord
from minilm_jax.training.metrics import MetricWriter


class _Preemption:
  """Tells the loop when SIGTERM asks it to save the step it is on and stop. With several processes
  each may see the signal at a different step, so JAX's distributed runtime (which receives the
  signal itself) picks one step for all of them; a single process records the signal here."""

  def __init__(self):
    self.requested = False
    self.multi_process = jax.process_count() > 1
    if not self.multi_process:
      self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    self.requested = True

  def stop_at(self, step: int) -> bool:
    if self.multi_process:
      from jax.experimental import multihost_utils

      return multihost_utils.reached_preemption_sync_point(step)
    return self.requested

  def restore(self):
    if not self.multi_process:
      signal.signal(signal.SIGTERM, self._previous)


# Fields every training program's config has: the least value allowed, and the bound a value
# must stay below (None: none). Each program's config module adds its own beside its defaults
# (`RANGES` of distill/config.py, finetuning/config.py, task_distill/config.py).
# A step count the schedule, the checkpoints and the devices' step counter (int32) can hold.
MAX_STEPS = 2**31 - 1
TRAINING_RANGES = {
  # JAX's keys, numpy's generators and the seeds a grid adds to it (seed + 1, ...) all take it.
  "seed": (0, 2**31),
  "num_steps": (0, MAX_STEPS + 1),
  "epochs": (1, None),
  "batch_size": (1, None),
  "eval_batch_size": (1, None),
  "log_every": (1, None),
  "checkpoint.every": (1, None),
  "checkpoint.keep": (1, None),
  "mesh.model": (1, None),
}


class Above(float):
  """A range's least value that the field itself must stay above (a temperature: not 0)."""


def check_fields(config, ranges: dict, contradictions=()):
  """One line for the first field that is out of its range (`ranges`: field -> (least, below); a
  least of `Above(x)` excludes x itself), a float that is not finite, or two fields that contradict
  (`TRAINING_CONTRADICTIONS` and the program's `contradictions`)."""
  flat = traverse_util.flatten_dict(config.to_dict(), sep=".")
  for field, value in flat.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise UserError(f"{field}={value} is not a finite number: give it a value")
  for field, (least, below) in ranges.items():
    value = flat.get(field)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
      continue
    if isinstance(least, Above) and value <= least:
      raise UserError(f"{field}={value} is out of range: it must be above {float(least):g}")
    if value < least:
      raise UserError(f"{field}={value} is out of range: it must be at least {least}")
    if below is not None and value >= below:
      raise UserError(f"{field}={value} is out of range: it must be below {below}")
  for field, value in flat.items():  # a rate in range the 8-bit dropout mask cannot draw
    if field.rsplit(".", 1)[-1] == "dropout" and isinstance(value, float) and 0 < value < 1:
      dropout_bits.threshold(value, field)
  mesh_data = flat.get("mesh.data")
  if mesh_data is not None and mesh_data != -1 and mesh_data < 1:
    raise UserError(f"mesh.data={mesh_data} is out of range: use -1 (every device) or a count of at least 1")
  _check_contradictions(flat, contradictions)


# Pairs of fields a config may set one of, not both: (field, the value that leaves it unset, the
# other field, its unset value, why). Each program's config module adds its own
# (`CONTRADICTIONS` of distill/config.py); `student.from_run` and the student fields it fills are
# checked against the run they name (`task_distill.run`).
TRAINING_CONTRADICTIONS = (
  (
    "optimizer.warmup_proportion",
    0.0,
    "optimizer.warmup_steps",
    0,
    "the warm-up is a share of the steps or a count of them",
  ),
)


def steps_of_epochs(epochs: int, batches_per_epoch: int, field: str) -> int:
  """The step count of `epochs` passes of `batches_per_epoch` batches; one line when it is more than
  a run can count (`MAX_STEPS`)."""
  steps = epochs * batches_per_epoch
  if steps > MAX_STEPS:
    raise UserError(
      f"{field}={epochs} passes of {batches_per_epoch} batches make {steps} steps, more than the "
      f"{MAX_STEPS} a run counts: give fewer"
    )
  return steps


def _check_contradictions(flat: dict, pairs=()):
  """One line naming both fields of the first pair of `TRAINING_CONTRADICTIONS` and `pairs` that a
  config (`flat`: its fields by dotted name) sets together (a field it does not have counts as unset)."""
  for field, unset, other, other_unset, why in (*TRAINING_CONTRADICTIONS, *pairs):
    value, other_value = flat.get(field, unset), flat.get(other, other_unset)
    if value not in (unset, None) and other_value not in (other_unset, None):
      raise UserError(
        f"{field}={value} and {other}={other_value} contradict ({why}): set {field}={unset} or {other}={other_unset}"
      )


def begin_run(config, workdir: str, ranges: dict, contradictions=()) -> RunRecord | None:
  """Checks shared by every training program before anything is loaded or written: a workdir to
  write to, fields in `ranges` (the program's config module's `RANGES`), no two fields that
  contradict (`check_fields`, with the program's `contradictions`), (with several
  processes) that every process was started with the same config, and that no other program runs
  on the workdir (`runs.lock`: from here until the run's last write, it is this run's). Returns the
  record of the run it resumes (None for a new run), read once for every check of the start."""
  if not workdir:
    raise UserError("--workdir is required: the directory for checkpoints, metrics and results")
  if os.path.isfile(workdir):
    raise UserError(f"--workdir {workdir} is a file: name a directory for the run's checkpoints, metrics and results")
  check_fields(config, ranges, contradictions)
  given = config_json(config)
  check_same_config(given)
  record = _resumed_record(workdir)
  _check_resumable(given, workdir, record)  # read-only: a refused resume leaves the workdir as it was
  if jax.process_index() == 0:  # for every process of the run: they share the workdir
    lock.hold(workdir)
  return record


# Fields no program's defaults hold, which only a user adds: a change of them is the user's.
_USERS_OWN = ("family",)

# What may change when a run is resumed: its length, logging, checkpointing and device layout.
_MAY_CHANGE_ON_RESUME = (
  "num_steps",
  "epochs",
  "log_every",
  "checkpoint.",
  "mesh.",
  "eval_batch_size",
  "data.num_proc",
  "evaluators.",
)


def _resumed_record(workdir: str) -> RunRecord | None:
  """The record of the run a program at `workdir` would resume (its newest readable checkpoint's),
  or None where there is none to resume."""
  if not is_run(workdir):
    return None
  ckpt = RunCheckpoints(workdir, read_only=True)
  try:
    return ckpt.read_record() if ckpt.latest_step() is not None else None
  finally:
    ckpt.close()


def _check_resumable(given: str, workdir: str, record: RunRecord | None):
  """A workdir that holds a run (its `record`) is resumed only with that run's config (`given`, as
  JSON), but for the fields that may change between restarts; anything else is refused with the
  differing fields."""
  if record is None:
    return
  saved = traverse_util.flatten_dict(record.config, sep=".")
  now = traverse_util.flatten_dict(json.loads(given), sep=".")
  # Fields on one side only come from another version of this program, not from the user, but for
  # those only a user adds (a family of students).
  compared = (saved.keys() & now.keys()) | {k for k in saved.keys() ^ now.keys() if k.startswith(_USERS_OWN)}
  # An input the record identifies by its content may lie elsewhere now: its digest is compared once read.
  compared -= record.named_by_content
  differing = sorted(
    k for k in compared if saved.get(k, "(none)") != now.get(k, "(none)") and not k.startswith(_MAY_CHANGE_ON_RESUME)
  )
  if differing:
    changes = ", ".join(f"{k}: {saved.get(k, '(none)')!r} -> {now.get(k, '(none)')!r}" for k in differing[:6])
    raise UserError(
      f"{workdir} holds a run started with another config ({changes}{', ...' if len(differing) > 6 else ''}): "
      f"rerun with that run's settings, or use a new --workdir"
    )


class Prefetcher:
  """Reads, collates and places the next batches on the devices in a background thread, up to
  `depth` steps ahead, so that the host's work overlaps the device's step instead of preceding it.
  Batches come out in stream order; an exception in the thread is raised by `next()`."""

  def __init__(self, stream, first: int, last: int, place, depth: int = 2):
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._thread = threading.Thread(
      target=self._work, args=(stream, first, last, place), daemon=True, name="batch-prefetch"
    )
    self._thread.start()

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _work(self, stream, first, last, place):
    try:
      for b in range(first, last):
        local = stream.batch(b)
        # every attention mask counts: a sentence-pair LSTM batch has one per sentence
        tokens = sum(int(v.sum()) for k, v in local.items() if k.startswith("attention_mask")) * jax.process_count()
        if not self._put((place(local), tokens)):
          return
    except BaseException as e:  # handed to the training thread, which raises it
      self._put(_Failure(e))

  def next(self):
    item = self._queue.get()
    if isinstance(item, _Failure):
      raise item.error
    return item

  def close(self):
    self._stop.set()
    self._thread.join()


class _Failure:
  def __init__(self, error):
    self.error = error


def _check_finite(pending: list, checkpoints):
  """Reads the metrics of the steps since the last check (one transfer) and stops the run at the
  first step whose update was skipped as non-finite. Returns the last step's metrics (None when
  every step was checked already)."""
  rows = host_scalars(pending)
  pending.clear()
  for done, metrics in rows:
    if metrics["skipped"]:
      latest = checkpoints.latest_step()
      kept = "no checkpoint was saved yet" if latest is None else f"the last checkpoint (step {latest}) is intact"
      raise UserError(
        f"non-finite loss or update at step {done} (loss {float(metrics['loss'])}): the update was not "
        f"applied and the run stops; {kept}: lower the learning rate or enable gradient clipping "
        f"(optimizer.clip_norm)"
      )
  return rows[-1][1] if rows else None


class LoopRun(Protocol):
  """What `train_loop` reads of a run (a distillation, a fine-tuning, a multi-task or task
  distillation run, the benchmark's train program): properties, so that a frozen dataclass's
  fields and a run's derived values satisfy them alike."""

  @property
  def config(self) -> Any:
    """The program's config: its `log_every`."""

  @property
  def workdir(self) -> str: ...

  @property
  def mesh(self) -> Any: ...

  @property
  def stream(self) -> Any:
    """A resumable batch stream (`data.corpus.BatchStream`)."""

  @property
  def num_steps(self) -> int: ...

  @property
  def checkpoints(self) -> Any:
    """`runs.RunCheckpoints`, or a stand-in that saves nothing."""

  def record(self) -> RunRecord:
    """What the run is, saved with each checkpoint."""


@dataclasses.dataclass(frozen=True)
class LoopHooks:
  """What a run adds to the loop beside its step: the progress bar's caption; `after_step(done,
  state) -> dict`, metrics to add (an evaluation at an epoch end); `evaluate(step, state) -> dict`
  (the distillation's evaluators), run at step 0 of a fresh run and after every step, its metrics
  ({} when none is due) logged at that step and given to the checkpoint saved there (a step that
  scores the metric that picks the best step is saved)."""

  desc: str
  after_step: Callable[[int, Any], dict] | None = None
  evaluate: Callable[[int, Any], dict] | None = None


def train_loop(run: LoopRun, state, next_batch: int, step_fn, hooks: LoopHooks):
  """Runs `state, metrics = step_fn(state, batch)` from `state.step` to `run.num_steps`, the
  batches read from `run.stream` and placed on `run.mesh` ahead of time (`Prefetcher`), logged
  every `run.config.log_every` steps into `run.workdir` and saved by `run.checkpoints` with
  `run.record()`, with what `hooks` add.

  Nothing is read back from the devices between log steps: the step skips a non-finite update on
  the device (`train_state.guarded_update`), and the loop checks those flags at every log step,
  before every save and at the end. Returns the last state.
  """
  stream, mesh, num_steps, checkpoints = run.stream, run.mesh, run.num_steps, run.checkpoints
  record, workdir, log_every = run.record(), run.workdir, run.config.log_every
  after_step, evaluate = hooks.after_step, hooks.evaluate
  start = int(host_scalars(state.step))
  fresh = checkpoints.latest_step() is None
  # Afresh, whatever an attempt killed before its first checkpoint logged goes (its step 0 too).
  writer = MetricWriter(workdir, -1 if fresh else start)
  saved_start = False
  if start == 0 and evaluate is not None and fresh:
    saved_start = _evaluate_start(run, state, next_batch, evaluate, writer)
  if start >= num_steps:
    if not saved_start and checkpoints.latest_step() is None:
      # num_steps 0: write the initial state (an ETD-extracted student, say) as the run's step-0 checkpoint.
      checkpoints.save(start, state, {"next_batch": next_batch}, record)
    checkpoints.wait()
    writer.close()
    return state
  preemption = _Preemption()
  prefetcher = Prefetcher(
    stream, next_batch, next_batch + max(num_steps - start, 0), partial(parallel.shard_batch, mesh=mesh)
  )
  window, pending = _Window(), []
  bar = tqdm(total=num_steps, initial=start, desc=hooks.desc, unit="step", disable=jax.process_index() != 0)
  try:
    for step in range(start, num_steps):
      batch, tokens = prefetcher.next()
      state, metrics = step_fn(state, batch)
      next_batch, done = next_batch + 1, step + 1
      window.steps, window.tokens = window.steps + 1, window.tokens + tokens
      pending.append((done, metrics))
      checkpoints.check()
      bar.update(1)
      extra = after_step(done, state) if after_step else {}
      scores = window.timed_evaluation(evaluate, done, state)
      if scores:  # logged with its own time: the step time and throughput leave it out
        extra.update(scores, eval_time_s=window.last_eval_seconds)
      if done % log_every == 0 or done == num_steps or extra:
        metrics = _check_finite(pending, checkpoints)
        writer.write(done, {**metrics, **extra, **window.rates()})
        bar.set_postfix(loss=f"{float(metrics['loss']):.4f}", lr=f"{float(metrics['lr']):.2e}")
        window = _Window()
      if preemption.stop_at(done):
        _check_finite(pending, checkpoints)
        checkpoints.save(done, state, {"next_batch": next_batch}, record)
        checkpoints.wait()
        raise Preempted(f"SIGTERM: saved the checkpoint of step {done} in {workdir}; rerun the same command to resume")
      if checkpoints.due(done) or done == num_steps or (scores and checkpoints.ranks(scores)):
        _check_finite(pending, checkpoints)
        checkpoints.save(done, state, {"next_batch": next_batch}, record, scores)
  finally:
    bar.close()
    prefetcher.close()
    preemption.restore()
    checkpoints.wait()
    writer.close()
  return state


def _evaluate_start(run: LoopRun, state, next_batch: int, evaluate, writer) -> bool:
  """A fresh run's evaluators at step 0, logged; the start saved as step 0 when it ranks (or is the
  whole run). Whether it was saved."""
  scores = evaluate(0, state)
  writer.write(0, scores)
  if run.checkpoints.ranks(scores) or run.num_steps == 0:
    run.checkpoints.save(0, state, {"next_batch": next_batch}, run.record(), scores)
    return True
  return False


@dataclasses.dataclass
class _Window:
  """The steps since the last log line: their count and real tokens, their wall time less the
  evaluations run among them (an evaluation is logged with its own time, not in the step time)."""

  start: float = dataclasses.field(default_factory=time.perf_counter)
  steps: int = 0
  tokens: int = 0
  eval_seconds: float = 0.0
  last_eval_seconds: float = 0.0

  def timed_evaluation(self, evaluate, done: int, state) -> dict:
    """`evaluate(done, state)`'s scores ({} when none is due, or no evaluators); the time of one
    that scored is `last_eval_seconds`, and left out of the window's."""
    began = time.perf_counter()
    scores = evaluate(done, state) if evaluate else {}
    if scores:
      self.last_eval_seconds = time.perf_counter() - began
      self.eval_seconds += self.last_eval_seconds
    return scores

  def rates(self) -> dict:
    elapsed = time.perf_counter() - self.start - self.eval_seconds
    return {"step_time_s": elapsed / self.steps, "tokens_per_s": self.tokens / elapsed}
