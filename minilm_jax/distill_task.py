"""Task-specific and multi-task distillation (the thesis):
`python -m minilm_jax.distill_task --config configs/task/<file>.py --workdir <dir>
--config.teacher=<fine-tuning run(s)> [--config.tasks=<task[,task...]>]`.

Augments each training set, labels it with the teacher (cached under the workdir), trains the
student, evaluates every task's dev split after each epoch, writes `results.json`. Rerun the same
command to resume. With `--config.lr_grid=1e-5,1.5e-5,5e-5`, one run per rate and the one with the
lowest dev loss chosen (`lr_grid.json`; MKD's last stage, `configs/task/mkd_finetune.py`).
"""

from absl import flags
from ml_collections import config_flags

from minilm_jax.cli.program import Program, run_program
from minilm_jax.task_distill.run import build_task_distillation, run_lr_grid

PROGRAM = Program()
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Task distillation config (configs/task/*.py).", lock_config=True, flag_values=PROGRAM.flag_values
)
_WORKDIR = flags.DEFINE_string(
  "workdir",
  "",
  "Directory for checkpoints, metrics, the teacher-logit cache, results.",
  flag_values=PROGRAM.flag_values,
)
flags.mark_flags_as_required(["config"], flag_values=PROGRAM.flag_values)


def main(argv):
  del argv
  if _CONFIG.value.lr_grid:
    rows, best = run_lr_grid(_CONFIG.value, _WORKDIR.value)
    print(f"lowest mean dev loss {rows[best]['dev_loss']:.4f} at lr {rows[best]['lr']:g}: {rows[best]['workdir']}")
  else:
    build_task_distillation(_CONFIG.value, _WORKDIR.value).run()


if __name__ == "__main__":
  run_program(main, PROGRAM)
