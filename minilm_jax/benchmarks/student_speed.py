"""`student_speed` suite: the thesis's speed tables, the task students' inference against the teacher's.

- Table 3.2 (section 3.5.2): model size and the total inference time over a training set at batch
  512, single sentences (SST-2, 67,350) for the BiLSTM and sentence pairs (QQP, 363,850) for the
  siamese BiLSTM, against BERT-large and ELMo.
- Table 4.4 (section 4.4.3): the total time of 100 batches of 128 QNLI pairs at length 128, the
  MKD-LSTM (bi-attentive) against the distilled BiLSTM, TinyBERT and BERT-PKD.

Both time the models' forward pass to the logits over a number of same-shaped batches, from the
first token to the last result ready; only the batch size and count differ, so one protocol with
`batch` and `batches` covers both (table 3.2 on SST-2: `--batch 512 --batches 132`; table 4.4:
`--batch 128 --batches 100`, the default). The students are this project's, with the shapes of
`configs/task/*.py` (the thesis's), and the distilled BiLSTM also as the thesis built it (300-d
word2vec in two channels: 0.96M parameters besides the vectors); the peers the thesis timed are
TinyBERT's 4x312 and BERT-PKD's 3x768 (our MKD-Transformer's shape) as BERT classifiers, and ELMo's
published shape (`elmo.py`). Every model has random weights (time does not depend on them). The
teacher is the BERT-base shape, reading the joint `[CLS] a [SEP] b [SEP]` sequence of `seq_len`
tokens as the Transformers do. The LSTMs and ELMo read the two sentences of a pair separately,
each `seq_len // 2` tokens (the same tokens as the joint sequence), and a single sentence
`seq_len`. Every sequence is full (no padding), as the thesis's fixed maximum length.

The thesis measured on one V100; its numbers are in each row's `thesis`; ours are measured on
whatever runs the command. Compare ratios, not seconds.
"""

import time
from typing import NamedTuple

import jax
import ml_collections
import numpy as np

from minilm_jax.benchmarks.elmo import CHARACTERS, CHARS_PER_TOKEN, ELMoBody
from minilm_jax.devices.timing import block, timing_params
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.flops import parse_shape
from minilm_jax.models.students import MultiTaskModel, make_student, refined_teacher, student_kind
from minilm_jax.task_distill.config import mkd_config, task_distillation_config

VOCAB = 30522  # BERT's WordPiece vocabulary: the students' too (the thesis's MKD students use WordPiece)
HEADS = (("task", 2),)


def _student_configs() -> dict:
  """{kind: the student block of the thesis's config for it} (configs/task/*.py)."""
  bilstm, mkd = task_distillation_config().student, mkd_config().student
  word2vec = ml_collections.ConfigDict(bilstm.to_dict())
  # The thesis's BiLSTM input (section 3.4.1): 300-d word2vec in two channels, tuned and frozen.
  # Timing reads no file: the flag only gives the model the second channel.
  word2vec.word_vectors, word2vec.multichannel = "GoogleNews-vectors-negative300.bin", True
  transformer = ml_collections.ConfigDict(mkd.to_dict())
  transformer.kind, transformer.num_layers = "transformer", 3
  return {"bilstm": bilstm, "bilstm_word2vec": word2vec, "biattentive": mkd, "transformer": transformer}


def _student(kind: str):
  """(inputs, build(teacher encoder config, vocab) -> model) of a student of `_student_configs`."""
  student = _student_configs()[kind]
  inputs = "joint" if student_kind(student.kind).joint else "words"
  return inputs, lambda encoder, vocab: make_student(student, HEADS, vocab, encoder)


def _classifier(shape: EncoderConfig):
  """A BERT-style classifier (pooled [CLS], a linear layer) of another shape than the teacher's."""
  return "joint", lambda encoder, vocab: refined_teacher(shape.replace(vocab_size=vocab), HEADS)


_TINYBERT = parse_shape("4x312").replace(intermediate_size=1200)  # TinyBERT's general 4-layer student
# ELMo under the distilled BiLSTM's task head (Dense(200) + ReLU -> logits).
_ELMO = ("chars", lambda encoder, vocab: MultiTaskModel(ELMoBody(), HEADS, fc=task_distillation_config().student.fc))


# The rows after each input kind's teacher: (name, reads pairs, (inputs, build), what the thesis
# measured for that model on one V100, where it did).
ROWS = (
  ("distilled BiLSTM (WordPiece, 300-d learnt: our default)", False, _student("bilstm"), ""),
  (
    "distilled BiLSTM (thesis: 300-d word2vec, 2 channels)",
    False,
    _student("bilstm_word2vec"),
    "3.2, SST-2: 0.96M, 2.44 s, 434x BERT-large's speed",
  ),
  ("ELMo (random weights)", False, _ELMO, "3.2, SST-2: 93.6M, 36.71 s, 15x slower than the BiLSTM"),
  ("distilled BiLSTM, siamese (WordPiece: our default)", True, _student("bilstm"), "4.4, QNLI: 1.36 s"),
  (
    "distilled BiLSTM, siamese (thesis: word2vec, 2 channels)",
    True,
    _student("bilstm_word2vec"),
    "3.2, QQP: 1.59M, 31.14 s, 185x BERT-large's",
  ),
  ("MKD-LSTM (bi-attentive, 256 units)", True, _student("biattentive"), "4.4, QNLI: 2.93 s, 0.46x the BiLSTM's speed"),
  ("MKD-Transformer (3x768: BERT-PKD's shape)", True, _student("transformer"), "4.4, QNLI: BERT-PKD 21.3M, 8.41 s"),
  ("TinyBERT (4x312)", True, _classifier(_TINYBERT), "4.4, QNLI: 5.0M, 3.68 s"),
  ("ELMo (random weights), pairs", True, _ELMO, "3.2, QQP: 93.6M, 256 s, 8x slower than the BiLSTM"),
)
TEACHER_THESIS = {False: "3.2, BERT-large on SST-2: 335M, 1060 s", True: "3.2, BERT-large on QQP: 5766 s"}


class Shape(NamedTuple):
  """A timed batch's examples and tokens an example."""

  batch: int
  seq_len: int


def _batch(inputs: str, pair: bool, shape: Shape, vocab: int, rng) -> dict:
  """Full inputs (no padding) of `shape`: the joint `[CLS] a [SEP] b [SEP]` sequence of `seq_len`
  tokens ("joint"), or each sentence apart, `seq_len // 2` tokens of a pair, as word ids ("words")
  or as ELMo's characters of each token ("chars")."""
  batch, seq_len = shape.batch, shape.seq_len
  ids = lambda length: rng.integers(min(1000, vocab // 2), vocab, (batch, length)).astype(np.int32)
  ones = lambda length: np.ones((batch, length), np.int32)
  if inputs == "joint":  # the second segment's type ids on its half
    types = np.zeros((batch, seq_len), np.int32)
    types[:, seq_len // 2 :] = int(pair)
    return {"input_ids": ids(seq_len), "attention_mask": ones(seq_len), "token_type_ids": types}
  length = seq_len // 2 if pair else seq_len
  if inputs == "chars":
    chars = lambda: rng.integers(1, CHARACTERS, (batch, length, CHARS_PER_TOKEN)).astype(np.int32)
    out = {"input_chars": chars(), "attention_mask": ones(length)}
    return {**out, "input_chars_b": chars(), "attention_mask_b": ones(length)} if pair else out
  out = {"input_ids": ids(length), "attention_mask": ones(length)}
  if pair:
    out.update(input_ids_b=ids(length), attention_mask_b=ones(length))
  return out


def _models(teacher: str, vocab: int):
  """(name, inputs, reads pairs, model, the thesis's number) in the order of the rows."""
  encoder = parse_shape(teacher).replace(vocab_size=vocab)
  label = f"teacher {teacher}" + {"12x768": " (BERT-base)", "24x1024": " (BERT-large)"}.get(teacher, "")
  for pair in (False, True):
    yield label, "joint", pair, refined_teacher(encoder, HEADS), TEACHER_THESIS[pair]
    for name, pairs, (inputs, build), thesis in ROWS:
      if pairs == pair:
        yield name, inputs, pair, build(encoder, vocab), thesis


def _without_embeddings(params) -> int:
  """Parameters outside the word, position and type tables (the thesis's BiLSTM counts leave out
  its word vectors)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return sum(x.size for path, x in flat if not any("embedding" in str(getattr(k, "key", "")) for k in path))


def run(batch: int = 128, batches: int = 100, seq_len: int = 128, teacher: str = "12x768", vocab: int = VOCAB):
  """`vocab`: the word vocabulary of every model (BERT's; a test's tiny one compiles faster)."""
  rng = np.random.default_rng(0)
  rows = []
  for name, inputs, pair, model, thesis in _models(teacher, vocab):
    sample = _batch(inputs, pair, Shape(1, seq_len), vocab, rng)
    params = timing_params(lambda key, model=model, sample=sample: model.init(key, sample, "task")["params"], rng)
    batch_arrays = _batch(inputs, pair, Shape(batch, seq_len), vocab, rng)
    forward = jax.jit(lambda p, b, model=model: model.apply({"params": p}, b, "task"))
    block(forward(params, batch_arrays))  # compile
    start = time.perf_counter()
    block([forward(params, batch_arrays) for _ in range(batches)])
    seconds = time.perf_counter() - start
    rows.append(
      {
        "model": name,
        "inputs": "pairs" if pair else "sentences",
        "params_M": sum(x.size for x in jax.tree.leaves(params)) / 1e6,
        "params_M_without_embeddings": _without_embeddings(params) / 1e6,
        "batch": batch,
        "batches": batches,
        "seq_len": seq_len,
        "seconds": seconds,
        "speedup_over_teacher": None,
        "thesis": thesis,
      }
    )
  for row in rows:  # each input kind against its own teacher row
    reference = next(r for r in rows if r["inputs"] == row["inputs"] and r["model"].startswith("teacher"))
    row["speedup_over_teacher"] = reference["seconds"] / row["seconds"]
  return rows
