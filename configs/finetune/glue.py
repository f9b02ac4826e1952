"""Fine-tuning on a GLUE task or XNLI, with the supplementary's section 4 settings.

  python -m minilm_jax.finetune --config configs/finetune/glue.py --workdir <dir> \
      --config.task=sst2 --config.init=<run workdir or HF dir> [--config.data_dir=<GLUE task folder>]

Max length 128, batch 32; `--grid` tries learning rates {2e-5, 3e-5, 4e-5, 5e-5} x epochs {3, 4, 5}.
"""

from minilm_jax.finetuning.config import base_config


def get_config():
  return base_config()
