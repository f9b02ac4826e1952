"""A run's workdir: its checkpoints (`checkpoints`), what the run is (`record`), reading it as a
model (`reading`), exporting it as a Hugging Face directory (`export`), and the one run a workdir
holds at a time (`lock`: `run.lock`).

    <workdir>/checkpoints/<step>/{state,data,meta}   Orbax; meta: the run's RunRecord
    <workdir>/tokenizer/                              the run's tokenizer
    <workdir>/metrics.jsonl, results.json             what the run measured
"""

from minilm_jax.runs.checkpoints import RunCheckpoints, checkpoint_dir, is_run
from minilm_jax.runs.export import export_run
from minilm_jax.runs.reading import (
  TOKENIZER_DIR,
  encoder_config_of,
  load_encoder,
  load_tokenizer_of,
  read_record,
  read_run,
  save_tokenizer,
  sentence_pipeline_of,
  write_run_from_hf,
)
from minilm_jax.runs.record import RunRecord

__all__ = [
  "TOKENIZER_DIR",
  "RunCheckpoints",
  "RunRecord",
  "checkpoint_dir",
  "encoder_config_of",
  "export_run",
  "is_run",
  "load_encoder",
  "load_tokenizer_of",
  "read_record",
  "read_run",
  "save_tokenizer",
  "sentence_pipeline_of",
  "write_run_from_hf",
]
