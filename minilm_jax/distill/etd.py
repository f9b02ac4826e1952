"""Extract Then Distill (ETD): initialise a student from its teacher's parameters.

1. Width-wise extraction to a "thin teacher" of the student's width: FFN neurons (intermediate
   units), head neurons (dimensions inside each head; the number of heads is kept) and hidden
   dimensions. With hidden consistency one set of hidden indices is used everywhere (embeddings,
   every projection's input rows and output columns, every LayerNorm), so residual connections
   still add up the same teacher dimensions; ETD-wo-hidn-con lets each layer pick its own.
2. ETD-Rand picks indices at random (seeded); ETD-Impt keeps the most important neurons by the
   first-order Taylor score |sum_t a_t * dL(x)/da_t| of each of the corpus's first
   `etd.num_sentences` sentences x, summed over them (`importance.py`), L the teacher's masked-LM
   loss. A hidden dimension's score is the sum over layers of its MHA-input neuron scores
   (equation 8). `etd.reverse` keeps the least important neurons of the types it names instead
   (ETD table 2's rev-ffn, rev-head, rev-hidden and rev-all).
3. Depth: the student's layers are thin-teacher layers chosen uniformly (every L/M-th), or the
   top or bottom M (the paper's ablations).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from flax import traverse_util

from minilm_jax.distill.importance import mlm_mask, taylor_scores
from minilm_jax.errors import UserError
from minilm_jax.models import layout
from minilm_jax.models.encoder import EncoderConfig, abstract_params
from minilm_jax.transfer.objectives import Masking

NEURON_TYPES = ("ffn", "head", "hidden")


def reversed_types(reverse: str) -> frozenset:
  """The neuron types whose least important neurons ETD-Impt keeps: "" (none), "all", or a comma list."""
  names = {n.strip() for n in reverse.split(",") if n.strip()}
  if names == {"all"}:
    return frozenset(NEURON_TYPES)
  unknown = sorted(names - set(NEURON_TYPES))
  if unknown:
    raise UserError(f"etd.reverse={reverse!r} names {unknown}: use all, or a comma list of {', '.join(NEURON_TYPES)}")
  return frozenset(names)


def _uniform_layers(teacher_layers: int, student_layers: int) -> list:
  """Teacher layer m * L / M for student layer m (1-based)."""
  if teacher_layers % student_layers:
    raise UserError(
      f"uniform layer selection needs the student's depth ({student_layers}) to divide the "
      f"teacher's ({teacher_layers}): choose a divisor, or the top/bottom strategy"
    )
  step = teacher_layers // student_layers
  return [m * step - 1 for m in range(1, student_layers + 1)]


# etd.layers: how the student's layers are chosen from the teacher's, by name -> (teacher layers,
# student layers) -> 0-based teacher layers. (Or the teacher's layers listed: `select_layers`.)
DEPTH_STRATEGIES = {
  "uniform": _uniform_layers,
  "top": lambda teacher_layers, student_layers: list(range(teacher_layers - student_layers, teacher_layers)),
  "bottom": lambda teacher_layers, student_layers: list(range(student_layers)),
}


def select_layers(teacher_layers: int, student_layers: int, strategy: str = "uniform") -> list:
  """0-based teacher layers for the student's layers: by a strategy of `DEPTH_STRATEGIES`, or the
  teacher's layers listed, 1-based and ascending ("1,2,6")."""
  if not 0 < student_layers <= teacher_layers:
    raise UserError(
      f"a {student_layers}-layer student cannot be taken from a {teacher_layers}-layer teacher: "
      f"use at most {teacher_layers} layers"
    )
  if strategy[:1].isdigit():
    return _listed_layers(strategy, teacher_layers, student_layers)
  if strategy not in DEPTH_STRATEGIES:
    raise UserError(
      f"unknown layer selection {strategy!r}: use one of {', '.join(DEPTH_STRATEGIES)}, or list the teacher's "
      f"layers (1-based), e.g. 1,2,6"
    )
  return DEPTH_STRATEGIES[strategy](teacher_layers, student_layers)


def _listed_layers(listed: str, teacher_layers: int, student_layers: int) -> list:
  try:
    layers = [int(n) for n in listed.split(",")]
  except ValueError:
    layers = []
  if (
    len(layers) != student_layers or layers != sorted(set(layers)) or not 1 <= layers[0] <= layers[-1] <= teacher_layers
  ):
    raise UserError(
      f"etd.layers={listed!r}: list {student_layers} of the teacher's layers 1..{teacher_layers}, ascending, "
      f"one per student layer (e.g. {','.join(str(n + 1) for n in range(student_layers))})"
    )
  return [n - 1 for n in layers]


def check_extractable(teacher: EncoderConfig, student: EncoderConfig):
  if student.num_heads != teacher.num_heads:
    raise UserError(
      f"ETD keeps the teacher's {teacher.num_heads} heads but the student has {student.num_heads}: "
      f"set student.num_heads={teacher.num_heads}"
    )
  for field in ("hidden_size", "intermediate_size"):
    if getattr(student, field) > getattr(teacher, field):
      raise UserError(
        f"the student is wider than its teacher ({field} {getattr(student, field)} > "
        f"{getattr(teacher, field)}): ETD can only extract a narrower student"
      )


def random_indices(teacher: EncoderConfig, student: EncoderConfig, seed: int, hidden_consistency: bool = True) -> dict:
  """ETD-Rand: sorted random index sets, reproducible from `seed`."""
  rng = np.random.default_rng(seed)
  pick = lambda n, k: np.sort(rng.choice(n, k, replace=False))
  head_dim, student_head_dim = teacher.head_dim, student.head_dim
  shared_hidden = pick(teacher.hidden_size, student.hidden_size)
  layers = []
  for _ in range(teacher.num_layers):
    layers.append(
      {
        "hidden": shared_hidden if hidden_consistency else pick(teacher.hidden_size, student.hidden_size),
        "heads": np.stack([pick(head_dim, student_head_dim) for _ in range(teacher.num_heads)]),
        "ffn": pick(teacher.intermediate_size, student.intermediate_size),
      }
    )
  return {"hidden": shared_hidden, "layers": layers}


def top_indices(
  scores: dict, student: EncoderConfig, hidden_consistency: bool = True, reverse: frozenset = frozenset()
) -> dict:
  """ETD-Impt: the highest-scoring neurons (sorted by position); the lowest-scoring for the types in
  `reverse` (`reversed_types`). `scores` as `importance.taylor_scores` returns. Without hidden
  consistency each layer keeps the top dimensions of its own MHA input."""

  def top(neuron_type):
    sign = 1.0 if neuron_type in reverse else -1.0
    return lambda s, k: np.sort(np.argsort(sign * np.asarray(s), kind="stable")[:k])

  hidden_top, head_top, ffn_top = top("hidden"), top("head"), top("ffn")
  hidden = hidden_top(scores["hidden"], student.hidden_size)
  layers = [
    {
      "hidden": hidden if hidden_consistency else hidden_top(layer["hidden"], student.hidden_size),
      "heads": np.stack([head_top(h, student.head_dim) for h in layer["heads"]]),
      "ffn": ffn_top(layer["ffn"], student.intermediate_size),
    }
    for layer in scores["layers"]
  ]
  return {"hidden": hidden, "layers": layers}


def _columns(heads_HxK, head_dim):
  """Flat Q/K/V columns of the kept dimensions of every head."""
  return (np.arange(len(heads_HxK))[:, None] * head_dim + heads_HxK).reshape(-1)


def extract(
  teacher_params, teacher: EncoderConfig, student: EncoderConfig, indices: dict, layer_strategy: str = "uniform"
) -> dict:
  """The student's parameters, taken from the teacher's by `indices` and the layer selection: every
  parameter of the encoder's layout (`models.layout`) keeps the index sets its `etd_axes` name."""
  check_extractable(teacher, student)
  flat = traverse_util.flatten_dict(teacher_params, sep="/")
  selected = select_layers(teacher.num_layers, student.num_layers, layer_strategy)
  # With hidden consistency every layer shares one set; without, the embeddings follow the first
  # kept layer and the pooler the last.
  ends = {
    "input_hidden": indices["layers"][selected[0]]["hidden"],
    "output_hidden": indices["layers"][selected[-1]]["hidden"],
  }

  def take(path, row, layer):
    index_sets = dict(ends)
    if layer is not None:
      idx = indices["layers"][layer]
      index_sets.update(hidden=idx["hidden"], ffn=idx["ffn"], heads=_columns(idx["heads"], teacher.head_dim))
    x = np.asarray(flat[path])
    return x[np.ix_(*(np.arange(n) if axis is None else index_sets[axis] for axis, n in zip(row.etd_axes, x.shape)))]

  # What the student has: a pre-norm student's first layer has no norm before its attention, whichever
  # teacher layer it is taken from.
  wanted = traverse_util.flatten_dict(abstract_params(student), sep="/")
  out = {}
  for row in layout.param_rows(teacher.model_type, flat):
    if row.per_layer:
      for s, t in enumerate(selected):
        if row.path.format(i=s) in wanted:
          out[row.path.format(i=s)] = take(row.path.format(i=t), row, t)
    elif row.path in wanted:
      out[row.path] = take(row.path, row, None)
  return traverse_util.unflatten_dict(out, sep="/")


def scoring_batches(sentences, tokenizer, max_len: int, seed: int, batch_size: int = 32):
  """Tokenised, BERT-masked batches of the scoring sentences."""
  rng, masking = np.random.default_rng(seed), Masking.of(tokenizer)
  for start in range(0, len(sentences), batch_size):
    enc = tokenizer(
      sentences[start : start + batch_size],
      truncation=True,
      max_length=max_len,
      padding="max_length",
      return_tensors="np",
    )
    ids, mask = enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)
    masked, weights = mlm_mask(ids, mask, masking, len(tokenizer), rng)
    yield {
      "input_ids": ids,
      "attention_mask": mask,
      "token_type_ids": np.zeros_like(ids),
      "masked_ids": masked,
      "weights": weights,
    }


@dataclasses.dataclass(frozen=True)
class _Extraction:
  """What a width method needs to choose the teacher's neurons (`initial_student_params`)."""

  etd_config: Any
  teacher: EncoderConfig
  teacher_params: Any
  mlm_head: Any
  student: EncoderConfig
  sentences_fn: Callable
  tokenizer: Any
  max_len: int
  reverse: frozenset


def _random_neurons(e: _Extraction) -> dict:
  """ETD-Rand: neurons drawn at random (`random_indices`): no ranks to reverse."""
  if e.reverse:
    raise UserError(f"etd.reverse={e.etd_config.reverse!r} reverses importance ranks: use it with etd.method=impt")
  return random_indices(e.teacher, e.student, e.etd_config.seed, e.etd_config.hidden_consistency)


def _important_neurons(e: _Extraction) -> dict:
  """ETD-Impt: the neurons of highest Taylor importance on the corpus's first sentences."""
  if e.mlm_head is None:
    raise UserError(
      "the teacher has no masked-LM head, so ETD-Impt has no importance scores: use "
      "--config.etd.method=rand, or a teacher checkpoint saved with its MLM head"
    )
  batches = scoring_batches(e.sentences_fn(e.etd_config.num_sentences), e.tokenizer, e.max_len, e.etd_config.seed)
  scores = taylor_scores(e.teacher, e.teacher_params, e.mlm_head, batches)
  return top_indices(scores, e.student, e.etd_config.hidden_consistency, e.reverse)


# etd.method: how the teacher's neurons are chosen, by name -> (_Extraction) -> index sets.
WIDTH_METHODS = {"rand": _random_neurons, "impt": _important_neurons}


def initial_student_params(
  etd_config,
  teacher: EncoderConfig,
  teacher_params,
  mlm_head,
  student: EncoderConfig,
  sentences_fn,
  tokenizer,
  max_len: int,
):
  """The student's parameters by ETD-Rand or ETD-Impt (`WIDTH_METHODS`). `mlm_head` is the
  teacher's MLM head (None if it has none); `sentences_fn(n)` gives the corpus's first n sentences
  (only ETD-Impt reads them)."""
  check_extractable(teacher, student)
  if etd_config.method not in WIDTH_METHODS:
    raise UserError(f"unknown etd.method {etd_config.method!r}: use {' or '.join(WIDTH_METHODS)}")
  reverse = reversed_types(etd_config.reverse)
  extraction = _Extraction(
    etd_config, teacher, teacher_params, mlm_head, student, sentences_fn, tokenizer, max_len, reverse
  )
  indices = WIDTH_METHODS[etd_config.method](extraction)
  return extract(teacher_params, teacher, student, indices, etd_config.layers)
