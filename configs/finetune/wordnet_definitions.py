"""The offline sequence-to-sequence demo: definition modelling from WordNet ("word : example
sentence" -> the definition), small enough for a CPU: total length 64, output 24, batch 32, lr 3e-4,
3 epochs, beam 4, length penalty 1.0, repeated bigrams blocked."""

from minilm_jax.finetuning.config import base_config


def get_config():
  c = base_config()
  c.task = "wordnet_definitions"
  c.max_seq_length, c.seq2seq.target_length = 64, 24
  c.batch_size, c.eval_batch_size = 32, 100
  c.optimizer.lr, c.epochs = 3e-4, 3
  c.seq2seq.beam_size, c.seq2seq.no_repeat_ngram = 4, 2
  c.log_every = 20
  return c
