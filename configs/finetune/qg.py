"""Question generation on SQuAD 1.1 with the MiniLM supplementary's settings for a 6-layer
student (`get_config("12")`: a 12-layer one); see `tasks.config.seq2seq_config`."""

from minilm_jax.finetuning.config import seq2seq_config


def get_config(layers: str = "6"):
  return seq2seq_config("qg", int(layers))
