"""The defaults every fine-tuning config starts from: `configs/finetune/*.py` override what their task changes."""

import ml_collections

from minilm_jax.train_state import adamw_config


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "sst2"  # cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, xnli, squad2
  c.init = ""  # a run's workdir (distillation, fine-tuning, convert --from-hf) or a Hugging Face directory
  c.data_dir = ""  # the task's folder of GLUE TSV / SQuAD JSON files; empty: the Hugging Face hub (online)
  c.language = ""  # XNLI from the hub: the language subset
  c.max_seq_length = 128
  c.batch_size = 32
  c.eval_batch_size = 128
  c.epochs = 3
  c.dropout = 0.1
  c.dtype = "float32"  # bfloat16 on accelerators
  c.seed = 0

  c.optimizer = adamw_config(lr=3e-5, clip_norm=1.0)
  c.optimizer.warmup_proportion = 0.1  # of all steps, then linear decay to 0

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # devices on the batch axis; -1: all that the model axis leaves
  c.mesh.model = 1  # devices each parameter matrix is split over

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 1000
  c.checkpoint.keep = 1

  c.log_every = 50

  # `python -m minilm_jax.finetune --grid` runs every lr x epochs pair as one run and tabulates them.
  c.grid = ml_collections.ConfigDict()
  c.grid.lrs = (2e-5, 3e-5, 4e-5, 5e-5)
  c.grid.epochs = (3, 4, 5)

  # SQuAD 2.0 windows and decoding (unused by the classification tasks).
  c.doc_stride = 128
  c.n_best = 20
  c.max_answer_length = 30
  c.null_score_threshold = 0.0
  return c
