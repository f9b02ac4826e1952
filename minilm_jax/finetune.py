"""Fine-tuning: `python -m minilm_jax.finetune --config configs/finetune/<file>.py --workdir <dir>
--config.task=<task> --config.init=<run workdir or HF dir> [--config.data_dir=<dir>] [--grid]`.

Evaluates on the task's dev split(s) after every epoch; writes `results.json`. With `--grid`, runs
every `config.grid` learning rate x epochs pair and writes `grid.md` / `grid.csv` with the best marked.
`--config.seeds=N` runs every setting (the config's own without `--grid`) N times and reports each
metric's mean and standard deviation.
Several tasks (`--config.task=sst2,mrpc,stsb`) train the thesis's multi-task refined teacher: one
encoder, one output layer per task, the tasks' batches shuffled together.
"""

from absl import flags
from ml_collections import config_flags

from minilm_jax.cli.program import Program, run_program
from minilm_jax.errors import UserError
from minilm_jax.finetuning.grid import run_grid
from minilm_jax.finetuning.multitask import build_multitask_finetuning
from minilm_jax.finetuning.run import build_finetuning

PROGRAM = Program()
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Fine-tuning config file (configs/finetune/*.py).", lock_config=True, flag_values=PROGRAM.flag_values
)
_WORKDIR = flags.DEFINE_string(
  "workdir", "", "Directory for checkpoints, metrics and results.", flag_values=PROGRAM.flag_values
)
_GRID = flags.DEFINE_bool(
  "grid", False, "Run the config's learning-rate x epochs grid as one batch job.", flag_values=PROGRAM.flag_values
)
flags.mark_flags_as_required(["config"], flag_values=PROGRAM.flag_values)


def main(argv):
  del argv
  multi_task = "," in _CONFIG.value.task
  if _GRID.value and multi_task:
    raise UserError("--grid tunes one task: run it per task, or drop --grid for multi-task refining")
  if _GRID.value:
    run_grid(_CONFIG.value, _WORKDIR.value)
  elif _CONFIG.value.seeds > 1 and not multi_task:
    run_grid(_CONFIG.value, _WORKDIR.value, settings=[(_CONFIG.value.optimizer.lr, _CONFIG.value.epochs)])
  elif multi_task:
    build_multitask_finetuning(_CONFIG.value, _WORKDIR.value).run()
  else:
    build_finetuning(_CONFIG.value, _WORKDIR.value).run()


if __name__ == "__main__":
  run_program(main, PROGRAM)
