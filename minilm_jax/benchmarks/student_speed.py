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
`configs/task/*.py` (the thesis's); the teacher is the BERT-base shape with random weights (time
does not depend on the weights), reading the joint `[CLS] a [SEP] b [SEP]` sequence of `seq_len`
tokens as the Transformers do. The LSTMs read the two sentences of a pair separately, each
`seq_len // 2` tokens (the same tokens as the joint sequence), and a single sentence `seq_len`.
Every sequence is full (no padding), as the thesis's fixed maximum length.

The thesis measured on one V100; its numbers are in `paper_seconds` and its speed-ups over the
slowest model in `paper_speedup`; ours are measured on whatever runs the command. Compare ratios,
not seconds.
"""

import time

import jax
import ml_collections
import numpy as np

from minilm_jax.benchmarks.distill import parse_shape
from minilm_jax.benchmarks.timing import block
from minilm_jax.models.students import make_student, refined_teacher, student_kind
from minilm_jax.task_distill.config import mkd_config, task_distillation_config

VOCAB = 30522  # BERT's WordPiece vocabulary: the students' too (the thesis's MKD students use WordPiece)

# What the thesis measured for the row's model (one V100), where it did.
THESIS = {
  ("teacher", False): "3.2, BERT-large on SST-2: 1060 s",
  ("bilstm", False): "3.2, SST-2: 2.44 s, 434x BERT-large's speed",
  ("teacher", True): "3.2, BERT-large on QQP: 5766 s",
  ("bilstm", True): "3.2, QQP: 31.14 s, 185x BERT-large's; 4.4, QNLI: 1.36 s",
  ("biattentive", True): "4.4, QNLI: 2.93 s, 0.46x the distilled BiLSTM's speed",
}


def _student_configs() -> dict:
  """{kind: the student block of the thesis's config for it} (configs/task/*.py)."""
  bilstm, mkd = task_distillation_config().student, mkd_config().student
  transformer = ml_collections.ConfigDict(mkd.to_dict())
  transformer.kind, transformer.num_layers = "transformer", 3
  return {"bilstm": bilstm, "biattentive": mkd, "transformer": transformer}


def _batch(joint: bool, pair: bool, batch: int, seq_len: int, vocab: int, rng) -> dict:
  ids = lambda length: rng.integers(min(1000, vocab // 2), vocab, (batch, length)).astype(np.int32)
  ones = lambda length: np.ones((batch, length), np.int32)
  if joint:  # [CLS] a [SEP] b [SEP] as one sequence; the second segment's type ids on its half
    types = np.zeros((batch, seq_len), np.int32)
    types[:, seq_len // 2 :] = int(pair)
    return {"input_ids": ids(seq_len), "attention_mask": ones(seq_len), "token_type_ids": types}
  length = seq_len // 2 if pair else seq_len
  out = {"input_ids": ids(length), "attention_mask": ones(length)}
  if pair:
    out.update(input_ids_b=ids(length), attention_mask_b=ones(length))
  return out


# (student kind, reads pairs) -> its row, in the order of the rows after each input's teacher.
STUDENT_NAMES = {
  ("bilstm", False): "distilled BiLSTM",
  ("bilstm", True): "distilled BiLSTM (siamese)",
  ("biattentive", True): "MKD-LSTM (bi-attentive)",
  ("transformer", True): "MKD-Transformer (3 layers)",
}


def _models(teacher: str, vocab: int):
  """(name, kind, reads the joint sequence, reads pairs, model) in the order of the rows."""
  encoder = parse_shape(teacher).replace(vocab_size=vocab)
  students = _student_configs()
  heads = (("task", 2),)
  label = f"teacher {teacher}" + {"12x768": " (BERT-base)", "24x1024": " (BERT-large)"}.get(teacher, "")
  for pair in (False, True):
    yield label, "teacher", True, pair, refined_teacher(encoder, heads)  # the teacher reads the joint sequence
    for (kind, pairs), name in STUDENT_NAMES.items():
      if pairs == pair:
        yield name, kind, student_kind(kind).joint, pair, make_student(students[kind], heads, vocab, encoder)


def _without_embeddings(params) -> int:
  """Parameters outside the word, position and type tables (the thesis's BiLSTM counts leave out
  its word vectors)."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return sum(x.size for path, x in flat if not any("embedding" in str(getattr(k, "key", "")) for k in path))


def run(batch: int = 128, batches: int = 100, seq_len: int = 128, teacher: str = "12x768", vocab: int = VOCAB):
  """`vocab`: the word vocabulary of every model (BERT's; a test's tiny one compiles faster)."""
  rng = np.random.default_rng(0)
  rows = []
  for name, kind, joint, pair, model in _models(teacher, vocab):
    params = jax.jit(model.init, static_argnums=2)(
      jax.random.key(0), _batch(joint, pair, 1, seq_len, vocab, rng), "task"
    )
    params = params["params"]
    inputs = _batch(joint, pair, batch, seq_len, vocab, rng)
    forward = jax.jit(lambda p, b, model=model: model.apply({"params": p}, b, "task"))
    block(forward(params, inputs))  # compile
    start = time.perf_counter()
    block([forward(params, inputs) for _ in range(batches)])
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
        "thesis": THESIS.get((kind, pair), ""),
      }
    )
  for row in rows:  # each input kind against its own teacher row
    reference = next(r for r in rows if r["inputs"] == row["inputs"] and r["model"].startswith("teacher"))
    row["speedup_over_teacher"] = reference["seconds"] / row["seconds"]
  return rows
