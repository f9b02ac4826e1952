"""Task-agnostic distillation:
`python -m minilm_jax.train --config configs/<file>.py --workdir <dir> [--config.<field>=<value>]`.

Rerunning the same command with the same workdir resumes from the latest complete checkpoint. A
config with a `family` of students distils them all from one teacher pass a batch (`distill.family`).
"""

from absl import flags
from ml_collections import config_flags

from minilm_jax.cli.program import Program, run_program
from minilm_jax.distill.trainer import build_distillation

PROGRAM = Program()
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Experiment config file (configs/*.py).", lock_config=True, flag_values=PROGRAM.flag_values
)
_WORKDIR = flags.DEFINE_string(
  "workdir", "", "Directory for checkpoints, metrics and the tokenizer.", flag_values=PROGRAM.flag_values
)
flags.mark_flags_as_required(["config"], flag_values=PROGRAM.flag_values)


def main(argv):
  del argv
  config = _CONFIG.value
  build_distillation(config, _WORKDIR.value).run()


if __name__ == "__main__":
  run_program(main, PROGRAM)
