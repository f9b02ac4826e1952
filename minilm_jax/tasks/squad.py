"""SQuAD 1.1 and 2.0: extractive question answering (2.0 adds unanswerable questions).

Inputs `[CLS] question [SEP] passage [SEP]`, passages longer than `max_seq_length` split into
windows overlapping by `doc_stride` tokens. An answer is a (start, end) token span; an
unanswerable question (or an answer outside the window) is the span at [CLS]. Decoding takes the
n-best starts and ends of every window, keeps spans inside the passage no longer than
`max_answer_length`; SQuAD 2.0 answers "" when the best null score beats the best span by more
than `null_score_threshold` (SQuAD 1.1 always answers). The metrics are the official exact match
and F1 (each the maximum over the gold answers), for 2.0 with HasAns/NoAns and the official
evaluation's best threshold beside the fixed one.
"""

import collections
import dataclasses
import functools
import json
import os
import re
import string
import sys
import unicodedata

import datasets
import jax.numpy as jnp
import numpy as np
import optax

from minilm_jax.data.corpus import map_batches
from minilm_jax.errors import UserError
from minilm_jax.models.heads import SPAN


def check_spans(path: str, spans) -> None:
  """Refuses a file whose answers do not lie where they say: `spans` are (question id, context,
  answer text, answer_start); each start must be a whole number at which the context holds the
  answer's text. One line naming the first bad question and how many there are."""
  bad = [
    (qid, start, text)
    for qid, context, text, start in spans
    if not isinstance(start, int) or isinstance(start, bool) or start < 0 or context[start : start + len(text)] != text
  ]
  if bad:
    qid, start, text = bad[0]
    raise UserError(
      f"{path}: {len(bad)} answer(s) do not lie at their answer_start in their context, the first of "
      f"question {qid} ({text[:40]!r} at {start!r}): fix the file's answer_start values"
    )


def _read_json(path: str, task: str) -> datasets.Dataset:
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
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (byte {e.start}): save the SQuAD JSON file as UTF-8") from None
  except (KeyError, TypeError, json.JSONDecodeError) as e:
    raise UserError(
      f"{path} is not a SQuAD JSON file for {task} ({type(e).__name__}: {e}): expected data/paragraphs/qas"
    ) from None
  check_spans(path, _answer_spans(rows))
  return datasets.Dataset.from_dict(dict(rows))


def _answer_spans(rows):
  """(question id, context, answer text, answer_start) of every answer of rows with the columns
  id, context, answer_texts and answer_starts."""
  for qid, context, texts, starts in zip(rows["id"], rows["context"], rows["answer_texts"], rows["answer_starts"]):
    for text, start in zip(texts, starts):
      yield qid, context, text, start


# --- the official SQuAD evaluation (1.1: exact match and F1; 2.0 adds no-answer questions) ----


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
  exact_, f1_, answered = np.asarray(exact, float), np.asarray(f1, float), np.asarray(has_answer)
  scores = {"exact": 100 * exact_.mean(), "f1": 100 * f1_.mean(), "total": len(exact_)}
  for name, rows in (("HasAns", answered), ("NoAns", ~answered)):
    if rows.any():
      scores.update(
        {
          f"{name}_exact": 100 * exact_[rows].mean(),
          f"{name}_f1": 100 * f1_[rows].mean(),
          f"{name}_total": int(rows.sum()),
        }
      )
  return scores


def best_threshold_scores(gold_answers: dict, spans: dict) -> dict:
  """The official SQuAD 2.0 evaluation's best threshold (its `find_best_thresh`, with our null-score
  margin as the no-answer probability): answering exactly the questions whose margin is at most
  the threshold, the exact match and F1 (in %) of the best threshold for each, and the threshold.
  `spans`: id -> (best span's text, null score minus span score)."""
  out = {}
  for name, metric in (("exact", exact_match), ("f1", f1_score)):
    # Every question unanswered scores the unanswerable ones; answering one more (in margin order)
    # adds its span's score if it has an answer, and loses 1 if it has none.
    golds = {q: [a for a in answers if normalize_answer(a)] for q, answers in gold_answers.items()}
    score = best = float(sum(not g for g in golds.values()))
    threshold = 0.0
    for qid in sorted(golds, key=lambda q: spans[q][1]):
      text, margin = spans[qid]
      score += max(metric(g, text) for g in golds[qid]) if golds[qid] else -bool(text)
      if score > best:
        best, threshold = score, float(margin)
    out[f"best_{name}"], out[f"best_{name}_thresh"] = 100 * best / len(golds), threshold
  return out


@dataclasses.dataclass(frozen=True)
class SquadTask:
  name: str = "squad2"
  hub: str = "rajpurkar/squad_v2"
  version: int = 2  # 1: every question has an answer; the null span is never predicted
  eval_splits: tuple = ("dev",)
  test_splits: tuple = ()
  metrics: tuple = ("f1", "exact")
  train_columns = ("input_ids", "attention_mask", "token_type_ids", "start_positions", "end_positions")

  def head(self, config=None) -> dict:
    return {"kind": SPAN}

  def load(self, split: str, data_dir: str = "") -> datasets.Dataset:
    if data_dir:
      names = (f"{split}-v{'1.1' if self.version == 1 else '2.0'}.json", f"{split}.json")
      for name in names:
        if os.path.isfile(os.path.join(data_dir, name)):
          return _read_json(os.path.join(data_dir, name), self.name)
      raise UserError(
        f"{self.name}: no {' or '.join(names)} in {data_dir}: set data_dir to a folder of the task's JSON files"
      )
    try:
      raw = datasets.load_dataset(self.hub, split=split.replace("dev", "validation"))
    except Exception as e:  # offline, ...: the hub's exception types vary by version
      raise UserError(
        f"{self.name}: could not load {self.hub} from the hub ({type(e).__name__}): set data_dir"
      ) from None
    rows = raw.map(
      lambda r: {"answer_texts": r["answers"]["text"], "answer_starts": r["answers"]["answer_start"]},
      remove_columns=["answers", "title"],
    )
    check_spans(self.hub, _answer_spans(rows))
    return rows

  def prepare(self, split: str, config, tokenizer):
    max_len, stride = config.max_seq_length, config.doc_stride
    if not 0 <= stride < max_len:
      raise UserError(
        f"doc_stride={stride} must be below max_seq_length={max_len} (windows overlap by doc_stride tokens): "
        f"lower doc_stride, e.g. to {max_len // 2}"
      )
    examples = self.load(split, config.data_dir)

    specials = tokenizer.num_special_tokens_to_add(pair=True)

    def windows(batch, indices):
      questions = [q.lstrip() for q in batch["question"]]
      # The tokenizer panics (not an exception) when a question leaves a window no more passage
      # tokens than the stride: find the longest question first.
      longest = max(len(ids) for ids in tokenizer(questions, add_special_tokens=False)["input_ids"])
      room = max_len - longest - specials
      if room <= stride:
        raise UserError(
          f"{self.name} {split}: a question of {longest} tokens leaves {max(room, 0)} passage tokens per "
          f"window at max_seq_length={max_len}, not more than doc_stride={stride}: lower doc_stride below "
          f"{max(room, 1)} or raise max_seq_length"
        )
      enc = tokenizer(
        questions,
        batch["context"],
        truncation="only_second",
        max_length=max_len,
        stride=stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
      )
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

    features = map_batches(examples, windows, f"{self.name} {split} windows", with_indices=True)
    return features, examples

  def loss(self, outputs, batch, config=None):
    start_logits, end_logits = outputs
    ce = optax.softmax_cross_entropy_with_integer_labels
    return jnp.mean(ce(start_logits, batch["start_positions"]) + ce(end_logits, batch["end_positions"])) / 2

  def decode(
    self, outputs, features, examples, n_best: int = 20, max_answer_length: int = 30, null_score_threshold: float = 0.0
  ):
    """(id -> predicted answer text, "" for no answer; id -> (best span's text, how far the null
    score beats it)), the second for the official evaluation's best threshold."""
    start_logits, end_logits = outputs
    by_example = collections.defaultdict(list)
    for f, example in enumerate(features["example_index"]):
      by_example[example].append(f)
    all_offsets = features["offsets"]
    predictions, spans = {}, {}
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
              best_span, best_text = s[a] + t[b], row["context"][offsets[a][0] : offsets[b][1]]
      answers_nothing = self.version == 2 and best_null - best_span > null_score_threshold
      predictions[row["id"]] = "" if answers_nothing else best_text
      spans[row["id"]] = (best_text, best_null - best_span)
    return predictions, spans

  def evaluate(self, outputs, features, examples, config=None):
    settings = (
      {}
      if config is None
      else dict(
        n_best=config.n_best,
        max_answer_length=config.max_answer_length,
        null_score_threshold=config.null_score_threshold,
      )
    )
    predictions, spans = self.decode(outputs, features, examples, **settings)
    gold = dict(zip(examples["id"], examples["answer_texts"]))
    scores = squad_v2_scores(gold, predictions)
    if self.version == 1:  # SQuAD 1.1's official script reports exact match and F1 alone
      return {k: scores[k] for k in ("exact", "f1", "total")}, predictions
    return {**scores, **best_threshold_scores(gold, spans)}, predictions


# --- MLQA (MiniLM table 13): train on SQuAD 1.1, stop early on MLQA's English dev set, report test F1/EM per language

MLQA_LANGUAGES = ("en", "es", "de", "ar", "hi", "vi", "zh")


# MLQA's answer normalisation (its paper, section 4.2, and its evaluation script): lower case, no
# punctuation (every Unicode punctuation character), no articles of the answer's language, and
# tokens split on whitespace, except Chinese, where every CJK character (and punctuation) is a token.
@functools.cache
def _unicode_punctuation() -> frozenset:
  return frozenset(
    chr(i) for i in range(sys.maxunicode + 1) if unicodedata.category(chr(i)).startswith("P")
  ) | frozenset(string.punctuation)


_ARTICLES = {
  "en": r"\b(a|an|the)\b",
  "es": r"\b(un|una|unos|unas|el|la|los|las)\b",
  "de": r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b",
  "vi": r"\b(của|là|cái|chiếc|những)\b",
  "ar": r"\sال^|ال",
  "hi": None,
  "zh": None,
}


def _mixed_segmentation(text: str) -> list:
  tokens, run = [], ""
  for char in text:
    if re.match(r"[\u4e00-\u9fa5]", char) or char in _unicode_punctuation():
      tokens += run.split() + [char]
      run = ""
    else:
      run += char
  return tokens + run.split()


def mlqa_normalize(text: str, language: str) -> list:
  """The tokens MLQA's exact match and F1 compare, for an answer in `language`."""
  if language not in _ARTICLES:
    raise UserError(f"MLQA has no language {language!r}: use one of {', '.join(MLQA_LANGUAGES)}")
  punctuation = _unicode_punctuation()
  text = "".join(c for c in text.lower() if c not in punctuation)
  articles = _ARTICLES[language]
  if articles:
    text = re.sub(articles, " ", text)
  return _mixed_segmentation(text) if language == "zh" else text.split()


def mlqa_scores(examples, predictions: dict) -> dict:
  """Exact match and F1 (in %) per language of `examples` (each the maximum over its gold
  answers), and their averages over the languages."""
  exact, f1 = collections.defaultdict(list), collections.defaultdict(list)
  for row in examples:
    language, predicted = row["language"], mlqa_normalize(predictions[row["id"]], row["language"])
    golds = [mlqa_normalize(a, language) for a in row["answer_texts"]]
    exact[language].append(max(float(g == predicted) for g in golds))
    f1[language].append(max(_token_f1(g, predicted) for g in golds))
  scores: dict[str, float] = {}
  for language in sorted(exact):
    scores[f"exact_{language}"] = 100 * float(np.mean(exact[language]))
    scores[f"f1_{language}"] = 100 * float(np.mean(f1[language]))
  scores["exact"] = float(np.mean([scores[f"exact_{l}"] for l in exact]))
  scores["f1"] = float(np.mean([scores[f"f1_{l}"] for l in exact]))
  return scores


def _token_f1(gold: list, predicted: list) -> float:
  same = sum((collections.Counter(gold) & collections.Counter(predicted)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(predicted), same / len(gold)
  return 2 * precision * recall / (precision + recall)


@dataclasses.dataclass(frozen=True)
class MlqaTask(SquadTask):
  """Local files only: SQuAD 1.1's `train-v1.1.json`, and MLQA's `dev-context-en-question-en.json`
  (model selection, as the paper) and `test-context-<l>-question-<l>.json` for each language there."""

  name: str = "mlqa"
  hub: str = ""
  version: int = 1
  eval_splits: tuple = ("dev", "test")

  def load(self, split: str, data_dir: str = "") -> datasets.Dataset:
    if not data_dir:
      raise UserError(
        "mlqa reads local files: set data_dir to a folder with SQuAD 1.1's train-v1.1.json and MLQA's "
        "dev-context-en-question-en.json and test-context-<l>-question-<l>.json"
      )
    if split == "train":
      return super().load(split, data_dir)
    parts = []
    for language in ("en",) if split == "dev" else MLQA_LANGUAGES:
      path = os.path.join(data_dir, f"{split}-context-{language}-question-{language}.json")
      if os.path.isfile(path):
        rows = _read_json(path, self.name)
        parts.append(rows.add_column("language", [language] * len(rows)))
    if not parts:
      raise UserError(f"mlqa: no {split}-context-<l>-question-<l>.json in {data_dir} (l: {', '.join(MLQA_LANGUAGES)})")
    return datasets.concatenate_datasets(parts)

  def evaluate(self, outputs, features, examples, config=None):
    settings = {} if config is None else dict(n_best=config.n_best, max_answer_length=config.max_answer_length)
    predictions, _ = self.decode(outputs, features, examples, **settings)
    return mlqa_scores(examples, predictions), predictions


TASKS = {t.name: t for t in (SquadTask(), SquadTask("squad1", "rajpurkar/squad", version=1), MlqaTask())}
