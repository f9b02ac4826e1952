"""Benchmarks: `python -m minilm_jax.bench <suite> [--json FILE] [flags]`, the suite one of distill,
kernels, inference, memory, etd, task_distill, student_speed, data, students, generate.

Each suite prints a table and, with --json, writes its rows as a JSON list. Times are medians after
a warm-up (compilation) call; every comparison is a ratio against a reference run in the same command.

  bench distill --case paper --dtype bfloat16          # BERT-base shape -> 6x384 and 6x768, batch 256, lengths 128/512
  bench distill --teacher 12x768 --student 6x384 --batch 64 --seq_len 128,512 --peers eager
  bench distill --case paper --dtype bfloat16 --seq_len 512 --student 6x384 --profile profiles   # where the time goes
  bench kernels --dtype bfloat16   # the fused kernels against XLA's path at the paper's batch 256 x 128 and x 512
  bench inference --batch 32 --seq_len 128
  bench student_speed --batch 512 --batches 132 --teacher 24x1024   # thesis table 3.2's protocol on SST-2
"""

import sys

from absl import flags

from minilm_jax.benchmarks import (
  data,
  distill,
  etd,
  generation,
  inference,
  kernels,
  memory,
  student_speed,
  students,
  task_distill,
)
from minilm_jax.cli.outputs import check_new_file, write_json
from minilm_jax.cli.program import Program, run_program
from minilm_jax.errors import UserError
from minilm_jax.reports.tables import format_table

PROGRAM = Program()
_JSON = flags.DEFINE_string(
  "json", None, "Also write the rows as a JSON list to this file.", flag_values=PROGRAM.flag_values
)
_REPEATS = flags.DEFINE_integer(
  "repeats", 3, "Timed repeats per measurement (after one warm-up).", lower_bound=1, flag_values=PROGRAM.flag_values
)
_STEPS = flags.DEFINE_integer(
  "steps",
  20,
  "etd: distillation steps after the starting loss; students: the distillation budget in steps (default 300).",
  lower_bound=1,
  flag_values=PROGRAM.flag_values,
)
_EPOCHS = flags.DEFINE_integer(
  "epochs",
  3,
  "task_distill: epochs of the augmented student (the others get as many steps); students: epochs of every "
  "fine-tuning (a second stage's over its augmented set).",
  lower_bound=1,
  flag_values=PROGRAM.flag_values,
)
_DTYPE = flags.DEFINE_enum(
  "dtype",
  "float32",
  ["float32", "bfloat16"],
  "Compute dtype (bfloat16 on accelerators).",
  flag_values=PROGRAM.flag_values,
)
_CASE = flags.DEFINE_string(
  "case",
  "cpu",
  "distill: the shapes, 'cpu' (2 CPU cores' worth) or 'paper' (batch 256, "
  "lengths 128 and 512, BERT-base shape -> 6x384 and 6x768).",
  flag_values=PROGRAM.flag_values,
)
_TEACHER = flags.DEFINE_string(
  "teacher",
  None,
  "distill: the teacher instead of the case's: 'demo', a shape such as "
  "12x768 (random weights), or a Hugging Face directory; students: a Hugging Face "
  "directory or run (default: the demo's all-MiniLM-L6-v2); student_speed: a shape (default 12x768).",
  flag_values=PROGRAM.flag_values,
)
_STUDENT = flags.DEFINE_list(
  "student",
  None,
  "distill: student shapes instead of the case's, e.g. 6x384,6x768; "
  "students: the one student shape (default 3x384); generate: the model's (default 6x384).",
  flag_values=PROGRAM.flag_values,
)
_BATCH = flags.DEFINE_integer(
  "batch",
  None,
  "Batch size instead of the case's (inference: default 8; generate: 32; student_speed: 128).",
  lower_bound=1,
  flag_values=PROGRAM.flag_values,
)
_SEQ_LEN = flags.DEFINE_list(
  "seq_len",
  None,
  "Sequence lengths instead of the case's (inference, etd: the first; default 128).",
  flag_values=PROGRAM.flag_values,
)
_TILINGS = flags.DEFINE_list(
  "tilings",
  [],
  "kernels: tilings to time, each BLOCKxWARPSxSTAGES (e.g. 64x4x2); default: the platform's (platform.TILINGS).",
  flag_values=PROGRAM.flag_values,
)
_TUNE = flags.DEFINE_bool(
  "tune",
  False,
  "kernels: time each kernel's forward and backward over a grid of tilings (--tilings, or the platform's) "
  "and write the fastest per chip and shape to the table the steps read (kernels/tuned_tilings.json).",
  flag_values=PROGRAM.flag_values,
)
_PROFILE = flags.DEFINE_string(
  "profile",
  "",
  "distill: also profile each row's step (jax.profiler, a few steps) into this folder and print where its time goes.",
  flag_values=PROGRAM.flag_values,
)
_PEERS = flags.DEFINE_list(
  "peers", list(distill.PEERS), "distill: the PyTorch peers to run: eager, compile.", flag_values=PROGRAM.flag_values
)
_FAMILY = flags.DEFINE_bool(
  "family",
  False,
  "distill: the students (--student, or the case's) distilled as one family, the teacher's pass shared, "
  "against each alone: the measured speed-up beside its ideal from the parts' FLOPs.",
  flag_values=PROGRAM.flag_values,
)
_TRAIN_STEPS = flags.DEFINE_integer(
  "train_steps",
  5,
  "distill: steps per timing window of the train program (it runs two windows); 0 skips it.",
  lower_bound=0,
  flag_values=PROGRAM.flag_values,
)
_MODELS = flags.DEFINE_list(
  "models",
  None,
  "students: the models to fine-tune (default: every baseline and recipe; the two-stage rows, e.g. "
  "embedding_etd_lr5e4+task_kd, only when named).",
  flag_values=PROGRAM.flag_values,
)
_TASKS = flags.DEFINE_list(
  "tasks",
  list(students.DEFAULT_TASKS),
  "students: the tasks, each a name, name=DATA (its folder or file; the VADER tasks: vaderSentiment's "
  "source package) or custom=FOLDER (train and dev files with columns text and label).",
  flag_values=PROGRAM.flag_values,
)
_SEEDS = flags.DEFINE_integer(
  "seeds",
  3,
  "students: fine-tuning runs per model and task (0: the frozen probes alone).",
  lower_bound=0,
  flag_values=PROGRAM.flag_values,
)
_FIRST_SEED = flags.DEFINE_integer(
  "first_seed",
  0,
  "students: the first fine-tuning seed (the runs take seeds first_seed to first_seed + seeds - 1): "
  "to add seeds where the earlier ones were measured on another host.",
  lower_bound=0,
  flag_values=PROGRAM.flag_values,
)
_CORPUS = flags.DEFINE_string(
  "corpus",
  "demo",
  "students: the distillation corpus (data.corpus: demo, or local .txt/.json/.jsonl/.parquet files).",
  flag_values=PROGRAM.flag_values,
)
_RESULTS = flags.DEFINE_string(
  "results",
  "",
  "students: a JSON Lines file every measurement is appended to as it is done; a rerun given the same "
  "file measures only what it lacks (the suite takes hours: a stopped one resumes, more seeds add to it); "
  "the distilled students are kept beside it.",
  flag_values=PROGRAM.flag_values,
)
_LOGGED_ONLY = flags.DEFINE_bool(
  "logged_only",
  False,
  "students: print the rows of what --results holds, measuring nothing (a suite still running, or stopped); "
  "a row that lacks fine-tunings counts them (ft_missing) and gives no mean over tasks.",
  flag_values=PROGRAM.flag_values,
)
_TARGET_LENGTH = flags.DEFINE_integer(
  "target_length",
  48,
  "generate: output tokens per sequence (--seq_len: the source's).",
  lower_bound=1,
  flag_values=PROGRAM.flag_values,
)
_BATCHES = flags.DEFINE_integer(
  "batches",
  100,
  "inference: batches averaged over (the paper's protocol: 100); student_speed: batches timed in total "
  "(the thesis's table 4.4: 100).",
  lower_bound=1,
  flag_values=PROGRAM.flag_values,
)


SUITES = {
  "distill": lambda: distill.run(
    distill.Settings(
      case=_CASE.value,
      repeats=_REPEATS.value,
      dtype=_DTYPE.value,
      teacher=_TEACHER.value,
      students=_STUDENT.value,
      batch_size=_BATCH.value,
      seq_lens=_seq_lens(),
      peers=_PEERS.value,
      train_steps=_TRAIN_STEPS.value,
      profile_dir=_PROFILE.value,
      family=_FAMILY.value,
    )
  ),
  "kernels": lambda: (kernels.tune if _TUNE.value else kernels.run)(
    _seq_lens() or [128, 512],
    _BATCH.value or 256,  # the paper's
    _DTYPE.value,
    _REPEATS.value if _REPEATS.present else 20,
    kernels.parse_tilings(_TILINGS.value),
  ),
  "inference": lambda: inference.run(_BATCHES.value, _DTYPE.value, _BATCH.value or 8, (_seq_lens() or [128])[0]),
  "memory": lambda: memory.run(),
  "etd": lambda: etd.run(_STEPS.value, seq_len=(_seq_lens() or [128])[0]),
  "task_distill": lambda: task_distill.run(task_distill.Settings(epochs=_EPOCHS.value)),
  "student_speed": lambda: student_speed.run(
    _BATCH.value or 128, _BATCHES.value, (_seq_lens() or [128])[0], _TEACHER.value or "12x768"
  ),
  "data": lambda: data.run(_seq_lens() or (128, 512)),
  "students": lambda: students.run(
    students.Settings(
      teacher="" if _TEACHER.value in (None, "demo") else _TEACHER.value,
      student=(_STUDENT.value or ["3x384"])[0],
      steps=_STEPS.value if _STEPS.present else 300,
      batch=_BATCH.value or 64,
      length=(_seq_lens() or [64])[0],
      tasks=tuple(_TASKS.value),
      seeds=_SEEDS.value,
      first_seed=_FIRST_SEED.value,
      finetune_epochs=_EPOCHS.value,
      corpus=_CORPUS.value,
      results=_RESULTS.value,
      models=tuple(_MODELS.value or students.BASELINES + tuple(students.RECIPES)),
      logged_only=_LOGGED_ONLY.value,
    )
  ),
  "generate": lambda: generation.run(
    (_STUDENT.value or ["6x384"])[0],
    _BATCH.value or 32,
    (_seq_lens() or [128])[0],
    _TARGET_LENGTH.value,
    _REPEATS.value,
    _DTYPE.value,
  ),
}


# The flags each suite reads (--json: every suite); one given to a suite that does not read it is
# refused rather than ignored.
SUITE_FLAGS = {
  "distill": {
    "case",
    "repeats",
    "dtype",
    "teacher",
    "student",
    "batch",
    "seq_len",
    "peers",
    "train_steps",
    "profile",
    "family",
  },
  "kernels": {"seq_len", "batch", "dtype", "repeats", "tilings", "tune"},
  "inference": {"batches", "dtype", "batch", "seq_len"},
  "memory": set(),
  "etd": {"steps", "seq_len"},
  "task_distill": {"epochs"},
  "student_speed": {"batch", "batches", "seq_len", "teacher"},
  "data": {"seq_len"},
  "students": {
    "teacher",
    "student",
    "steps",
    "batch",
    "seq_len",
    "tasks",
    "seeds",
    "first_seed",
    "epochs",
    "corpus",
    "results",
    "models",
  },
  "generate": {"student", "batch", "seq_len", "target_length", "repeats", "dtype"},
}
_OWN_FLAGS = set().union(*SUITE_FLAGS.values())


def _check_flags(suite: str):
  given = sorted(name for name in _OWN_FLAGS - SUITE_FLAGS[suite] if PROGRAM.flag_values[name].present)
  if given:
    reads = ", ".join(f"--{name}" for name in sorted(SUITE_FLAGS[suite] | {"json"}))
    raise UserError(f"bench {suite} does not read --{', --'.join(given)}: it reads {reads}")
  if _STUDENT.present and not _STUDENT.value:  # `--student=`: an empty list, which would measure the default
    raise UserError("--student= names no student: give one or more shapes, e.g. --student 6x384, or leave it out")


def _seq_lens():
  try:
    lengths = [int(n) for n in _SEQ_LEN.value] if _SEQ_LEN.value else None
  except ValueError:
    lengths = [0]
  if lengths is not None and min(lengths) < 2:
    raise UserError(
      f"--seq_len {','.join(_SEQ_LEN.value or [])}: give whole numbers of at least 2 ([CLS] and [SEP]), e.g. 128,512"
    )
  return lengths


def main(argv):
  if len(argv) != 2 or argv[1] not in SUITES:
    raise UserError(f"name one suite: python -m minilm_jax.bench <{'|'.join(SUITES)}> [--json FILE]")
  _check_flags(argv[1])
  if _JSON.value:
    check_new_file(_JSON.value, "--json")
  rows = SUITES[argv[1]]()
  print(format_table(rows))
  if _JSON.value:
    write_json(_JSON.value, rows)
  if argv[1] == "kernels" and not _TUNE.value and kernels.beyond_tolerance(rows):
    # Exit 1 is this and nothing else: a kernel differs from the explicit path by more than its dtype
    # allows (bad input exits 2, as in every program), so a chip's script can stop on it.
    print(f"kernels differ from the explicit path beyond tolerance: {kernels.beyond_tolerance(rows)}")
    sys.exit(1)


if __name__ == "__main__":
  run_program(main, PROGRAM)
