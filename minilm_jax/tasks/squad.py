"""SQuAD 2.0: extractive question answering with unanswerable questions.

Inputs `[CLS] question [SEP] passage [SEP]`, passages longer than `max_seq_length` split into
windows overlapping by `doc_stride` tokens. An answer is a (start, end) token span; an
unanswerable question (or an answer outside the window) is the span at [CLS]. Decoding takes the
n-best starts and ends of every window, keeps spans inside the passage no longer than
`max_answer_length`, and answers "" when the best null score beats the best span by more than
`null_score_threshold`. The metric is the official SQuAD 2.0 exact match and F1.
"""

import collections
import dataclasses
import json
import os
import re
import string

import datasets
import jax.numpy as jnp
import numpy as np
import optax

from minilm_jax.errors import UserError
from minilm_jax.models.heads import SPAN

_FILES = {"train": ("train-v2.0.json", "train.json"), "dev": ("dev-v2.0.json", "dev.json")}


def _read_json(path: str) -> datasets.Dataset:
  try:
    with open(path, encoding="utf-8") as f:
      articles = json.load(f)["data"]
    rows = collections.defaultdict(list)
    for article in articles:
      for paragraph in article["paragraphs"]:
        for qa in paragraph["qas"]:
          answers = [] if qa.get("is_impossible") else qa["answers"]
          rows["id"].append(qa["id"])
          rows["question"].append(qa["question"])
          rows["context"].append(paragraph["context"])
          rows["answer_texts"].append([a["text"] for a in answers])
          rows["answer_starts"].append([a["answer_start"] for a in answers])
  except (KeyError, TypeError, json.JSONDecodeError) as e:
    raise UserError(f"{path} is not a SQuAD 2.0 JSON file ({type(e).__name__}: {e}): expected data/paragraphs/qas") from None
  return datasets.Dataset.from_dict(dict(rows))


# --- the official SQuAD 2.0 evaluation --------------------------------------------------------

def normalize_answer(s: str) -> str:
  """Lower case, drop punctuation and the articles a/an/the, collapse white space."""
  s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def exact_match(gold: str, prediction: str) -> int:
  return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_score(gold: str, prediction: str) -> float:
  gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
  if not gold_tokens or not pred_tokens:  # a no-answer on either side scores 1 only if both are
    return float(gold_tokens == pred_tokens)
  same = sum((collections.Counter(gold_tokens) & collections.Counter(pred_tokens)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred_tokens), same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def squad_v2_scores(gold_answers: dict, predictions: dict) -> dict:
  """gold_answers: id -> list of answer texts ([] when unanswerable); predictions: id -> text ("" = no answer).
  Exact match and F1 (in %), overall and split into HasAns / NoAns, each the maximum over gold answers."""
  exact, f1, has_answer = [], [], []
  for qid, answers in gold_answers.items():
    if qid not in predictions:
      raise UserError(f"no prediction for question {qid}")
    golds = [a for a in answers if normalize_answer(a)] or [""]
    exact.append(max(exact_match(g, predictions[qid]) for g in golds))
    f1.append(max(f1_score(g, predictions[qid]) for g in golds))
    has_answer.append(golds != [""])
  exact, f1, has_answer = np.asarray(exact, float), np.asarray(f1, float), np.asarray(has_answer)
  scores = {"exact": 100 * exact.mean(), "f1": 100 * f1.mean(), "total": len(exact)}
  for name, rows in (("HasAns", has_answer), ("NoAns", ~has_answer)):
    if rows.any():
      scores.update({f"{name}_exact": 100 * exact[rows].mean(), f"{name}_f1": 100 * f1[rows].mean(),
                     f"{name}_total": int(rows.sum())})
  return scores


@dataclasses.dataclass(frozen=True)
class SquadTask:
  name: str = "squad2"
  hub: str = "rajpurkar/squad_v2"
  eval_splits: tuple = ("dev",)
  test_splits: tuple = ()
  metrics: tuple = ("f1", "exact")
  train_columns = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")

  def head(self) -> dict:
    return {"kind": SPAN}

  def load(self, split: str, data_dir: str = "") -> datasets.Dataset:
    if data_dir:
      for name in _FILES[split]:
        if os.path.isfile(os.path.join(data_dir, name)):
          return _read_json(os.path.join(data_dir, name))
      raise UserError(f"squad2: no {' or '.join(_FILES[split])} in {data_dir}: set data_dir to a folder of SQuAD 2.0 JSON files")
    try:
      raw = datasets.load_dataset(self.hub, split=split.replace("dev", "validation"))
    except Exception as e:  # offline, ...: the hub's exception types vary by version
      raise UserError(f"squad2: could not load {self.hub} from the hub ({type(e).__name__}): set data_dir") from None
    return raw.map(lambda r: {"answer_texts": r["answers"]["text"], "answer_starts": r["answers"]["answer_start"]},
                   remove_columns=["answers", "title"])

  def prepare(self, split: str, config, tokenizer):
    examples = self.load(split, config.data_dir)
    max_len, stride = config.max_seq_length, config.doc_stride

    def windows(batch, indices):
      enc = tokenizer([q.lstrip() for q in batch["question"]], batch["context"], truncation="only_second",
                      max_length=max_len, stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                      padding="max_length")
      out = collections.defaultdict(list)
      for i, sample in enumerate(enc["overflow_to_sample_mapping"]):
        sequence_ids = enc.sequence_ids(i)
        # Offsets of passage tokens only; (-1, -1) marks question, special and padding tokens.
        offsets = [o if s == 1 else (-1, -1) for o, s in zip(enc["offset_mapping"][i], sequence_ids)]
        start = end = 0
        if batch["answer_starts"][sample]:
          char_start = batch["answer_starts"][sample][0]
          char_end = char_start + len(batch["answer_texts"][sample][0])
          inside = [t for t, (a, b) in enumerate(offsets) if a >= 0 and a < char_end and b > char_start]
          if inside and offsets[inside[0]][0] <= char_start and offsets[inside[-1]][1] >= char_end:
            start, end = inside[0], inside[-1]
        out["input_ids"].append(enc["input_ids"][i])
        out["attention_mask"].append(enc["attention_mask"][i])
        out["token_type_ids"].append(enc.get("token_type_ids", [[0] * max_len] * (i + 1))[i])
        out["start_positions"].append(start)
        out["end_positions"].append(end)
        out["example_index"].append(indices[sample])
        out["offsets"].append(offsets)
      return dict(out)

    features = examples.map(windows, batched=True, with_indices=True, remove_columns=examples.column_names,
                            desc=f"squad2 {split} windows")
    return features, examples

  def loss(self, outputs, batch):
    start_logits, end_logits = outputs
    ce = optax.softmax_cross_entropy_with_integer_labels
    return jnp.mean(ce(start_logits, batch["start_positions"]) + ce(end_logits, batch["end_positions"])) / 2

  def decode(self, outputs, features, examples, n_best: int = 20, max_answer_length: int = 30,
             null_score_threshold: float = 0.0) -> dict:
    """id -> predicted answer text ("" for no answer)."""
    start_logits, end_logits = outputs
    by_example = collections.defaultdict(list)
    for f, example in enumerate(features["example_index"]):
      by_example[example].append(f)
    all_offsets = features["offsets"]
    predictions = {}
    for e, row in enumerate(examples):
      best_null, best_span, best_text = np.inf, -np.inf, ""
      for f in by_example[e]:
        s, t, offsets = start_logits[f], end_logits[f], all_offsets[f]
        best_null = min(best_null, s[0] + t[0])
        for a in np.argsort(s)[::-1][:n_best]:
          for b in np.argsort(t)[::-1][:n_best]:
            if offsets[a][0] < 0 or offsets[b][0] < 0 or b < a or b - a + 1 > max_answer_length:
              continue
            if s[a] + t[b] > best_span:
              best_span, best_text = s[a] + t[b], row["context"][offsets[a][0]:offsets[b][1]]
      predictions[row["id"]] = "" if best_null - best_span > null_score_threshold else best_text
    return predictions

  def evaluate(self, outputs, features, examples, config=None):
    settings = {} if config is None else dict(n_best=config.n_best, max_answer_length=config.max_answer_length,
                                              null_score_threshold=config.null_score_threshold)
    predictions = self.decode(outputs, features, examples, **settings)
    gold = dict(zip(examples["id"], examples["answer_texts"]))
    return squad_v2_scores(gold, predictions), predictions


TASKS = {"squad2": SquadTask()}
