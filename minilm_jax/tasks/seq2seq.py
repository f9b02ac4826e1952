"""Sequence-to-sequence tasks, fine-tuned as UniLM does (MiniLM supplementary section 1.1.2): one
encoder under a sequence-to-sequence self-attention mask (`models.heads.Seq2SeqLM`), decoded by
beam search (`models.generation`).

- `qg`: answer-aware question generation on SQuAD 1.1: passage (or the answer's sentence) and
  answer -> question. BLEU-4, METEOR, ROUGE-L.
- `cnndm`, `xsum`: abstractive summarisation. ROUGE-1/2/L F1.
- `wordnet_definitions`: definition modelling from WordNet 3.0, offline: a word and one of its
  example sentences -> the word's definition in that sense. ROUGE-L, BLEU-4, METEOR.

Data from local files (`data_dir`): `<split>.source` and `<split>.target` (one example per line),
or `<split>.jsonl` (`source` and `target` fields, or the task's own names: `document`/`summary`,
`article`/`highlights`); question generation also takes SQuAD 1.1's JSON (`<split>.json`,
`train-v1.1.json`/`dev-v1.1.json`). Without `data_dir`, the Hugging Face hub when online.

Training predicts every target token in one pass (see `Seq2SeqLM`), with label smoothing: the
default. UniLM instead masks a share of the target tokens and predicts them from [MASK] inputs
(`seq2seq.mask_prob` > 0; UniLM's 0.7; `mask_targets`), which keeps fine-tuning close to masked-LM
pre-training, and decodes by predicting a [MASK] appended after the tokens chosen so far. A
distilled student has no masked-LM training to stay close to, and the one-pass form trains on every
target token of every example and decodes with one cached position per token; both are here.
"""

import dataclasses
import json
import os
import re
import zlib

import datasets
import jax
import jax.numpy as jnp
import numpy as np

from minilm_jax.data import wordnet_db
from minilm_jax.data.corpus import map_batches
from minilm_jax.errors import UserError
from minilm_jax.models.generation import DecodeSettings
from minilm_jax.models.heads import SEQ2SEQ
from minilm_jax.tasks.generation_metrics import generation_scores
from minilm_jax.tasks.squad import check_spans

_COLUMNS = ("id", "source", "source_b", "target")


@dataclasses.dataclass(frozen=True)
class References:
  """What scoring generated tokens needs: the examples (their targets) and the tokenizer to read
  the tokens back."""

  examples: datasets.Dataset
  tokenizer: object


@dataclasses.dataclass(frozen=True)
class Seq2SeqTask:
  name: str
  metrics: tuple  # the first picks the best epoch and the grid's best setting
  hub: tuple = ()  # (dataset, subset, source field, target field)
  eval_splits: tuple = ("dev",)
  field_names: tuple = ()  # the JSON Lines fields of (source, target) besides "source"/"target"
  test_splits: tuple = ()
  submission_names: tuple = ()

  def head(self, config=None) -> dict:
    if config is None:
      raise UserError(f"{self.name} is a sequence-to-sequence task: its model is built from a fine-tuning config")
    head = {"kind": SEQ2SEQ, "target_length": config.seq2seq.target_length}
    if mask_prob(config) > 0:
      head["masked_targets"] = True
    return head

  # --- data -------------------------------------------------------------------------------------

  def load(self, split: str, data_dir: str = "", language: str = "", config=None) -> datasets.Dataset:
    """Columns id, source, source_b (the answer of question generation; else None), target."""
    if not data_dir:
      return self._load_hub(split)
    lines = [os.path.join(data_dir, f"{split}.{side}") for side in ("source", "target")]
    if all(os.path.isfile(p) for p in lines):
      return _read_lines(*lines)
    jsonl = os.path.join(data_dir, f"{split}.jsonl")
    if os.path.isfile(jsonl):
      return _read_jsonl(jsonl, (("source", "target"),) + ((self.field_names,) if self.field_names else ()))
    raise UserError(
      f"{self.name}: {data_dir} has neither {split}.source + {split}.target nor {split}.jsonl: {self._formats()}"
    )

  def _formats(self) -> str:
    return "give one example per line in <split>.source and <split>.target, or <split>.jsonl with source/target fields"

  def _load_hub(self, split: str) -> datasets.Dataset:
    if not self.hub:
      raise UserError(f"{self.name} reads local files: set data_dir ({self._formats()})")
    name, subset, source, target = self.hub
    hub_split = split.replace("dev", "validation")
    try:
      raw = datasets.load_dataset(name, subset, split=hub_split)
    except Exception as e:  # offline, unknown split, ...: the hub's exception types vary by version
      raise UserError(
        f"{self.name}: could not load {name} split {hub_split} from the hub ({type(e).__name__}): set "
        f"data_dir ({self._formats()})"
      ) from None
    return raw.map(
      lambda row, i: {"id": str(i), "source": row[source], "source_b": None, "target": row[target]},
      with_indices=True,
      remove_columns=raw.column_names,
    )

  def features(
    self, examples: datasets.Dataset, tokenizer, max_len: int, target_length: int, end_in_block: bool = False
  ) -> datasets.Dataset:
    """The model's blocks: [CLS] source [SEP] (source_b [SEP]) padded to max_len - target_length,
    then the target's tokens padded to target_length (segment 1); `labels` [target_length + 1]:
    the target's tokens, the end token ([SEP]), then -1. `end_in_block` (masked targets, whose
    end token is an input too): targets cut to target_length - 1 tokens, so that the end fits."""
    source_length = max_len - target_length
    pad, end = tokenizer.pad_token_id, tokenizer.sep_token_id
    segment = 1 if "token_type_ids" in tokenizer.model_input_names else 0  # RoBERTa has one segment

    def encode(batch):
      pair = batch["source_b"] if any(b is not None for b in batch["source_b"]) else None
      source = tokenizer(
        batch["source"], pair, truncation="only_first" if pair else True, max_length=source_length, padding="max_length"
      )
      targets = tokenizer(
        batch["target"], add_special_tokens=False, truncation=True, max_length=target_length - end_in_block
      )
      out: dict[str, list] = {"input_ids": [], "attention_mask": [], "token_type_ids": [], "labels": []}
      for i, target in enumerate(targets["input_ids"]):
        fill = target_length - len(target)
        out["input_ids"].append(source["input_ids"][i] + target + [pad] * fill)
        out["attention_mask"].append(source["attention_mask"][i] + [1] * len(target) + [0] * fill)
        types = source.get("token_type_ids", [[0] * source_length] * (i + 1))[i]
        out["token_type_ids"].append([0] * len(types) + [segment] * target_length)
        out["labels"].append(target + [end] + [-1] * fill)
      return out

    return map_batches(examples, encode, f"tokenise {self.name}")

  # --- model side -------------------------------------------------------------------------------

  train_columns = ("input_ids", "attention_mask", "token_type_ids", "labels")

  def prepare(self, split: str, config, tokenizer):
    """(features for the model, `References` to score generations against)."""
    check_lengths(config)
    examples = self.load(split, config.data_dir, config.language, config)
    s = config.seq2seq
    features = self.features(examples, tokenizer, config.max_seq_length, s.target_length, mask_prob(config) > 0)
    return features, References(examples, tokenizer)

  def loss(self, logits_BxTxV, batch, config=None):
    """Cross-entropy against the labels smoothed by the config's `seq2seq.label_smoothing` (that
    share spread evenly over the vocabulary; none without a config), averaged over the batch's
    target tokens."""
    label_smoothing = config.seq2seq.label_smoothing if config is not None else 0.0
    labels = batch["labels"]
    real = labels >= 0
    logp = jax.nn.log_softmax(logits_BxTxV, axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.maximum(labels, 0)[..., None], axis=-1)[..., 0]
    per_token = (1 - label_smoothing) * nll - label_smoothing * jnp.mean(logp, axis=-1)
    return jnp.sum(jnp.where(real, per_token, 0.0)) / jnp.maximum(jnp.sum(real), 1)

  def decode_settings(self, config, tokenizer) -> DecodeSettings:
    s = config.seq2seq
    specials = set(tokenizer.all_special_ids) - {tokenizer.sep_token_id}
    return DecodeSettings(
      beam_size=s.beam_size,
      max_length=s.target_length,
      min_length=s.min_target_length,
      length_penalty=s.length_penalty,
      no_repeat_ngram=s.no_repeat_ngram,
      end_id=tokenizer.sep_token_id,
      banned_ids=tuple(sorted(specials)),
      mask_id=tokenizer.mask_token_id,
    )

  def texts(self, outputs, tokenizer) -> list:
    return [
      tokenizer.decode(tokens[:length], skip_special_tokens=True, clean_up_tokenization_spaces=True).strip()
      for tokens, length in zip(np.asarray(outputs["tokens"]), np.asarray(outputs["lengths"]))
    ]

  def evaluate(self, outputs, features, references: References, config=None):
    """(metrics, id -> generated text) of a split's generations."""
    predictions = self.texts(outputs, references.tokenizer)
    wordnet_dir = config.data_dir if config is not None and self.name == "wordnet_definitions" else ""
    scores = generation_scores(self.metrics, predictions, list(references.examples["target"]), wordnet_dir)
    return scores, dict(zip(references.examples["id"], predictions))


def mask_prob(config) -> float:
  """`seq2seq.mask_prob`; runs saved before it existed were trained in the one-pass form (0)."""
  return config.seq2seq.get("mask_prob", 0.0)


# UniLM's (and BERT's) treatment of a chosen token: [MASK] 80 % of the time, a random token 10 %,
# itself 10 %.
_AS_MASK, _AS_RANDOM = 0.8, 0.1


def mask_targets(batch, rng, mask_prob: float, pad_id: int, mask_id: int, vocab_size: int) -> dict:
  """UniLM's fine-tuning input (Dong et al. 2019, section 2.4) from a one-pass batch: the target
  block holds t_1 .. t_n [SEP] (the end token is an input and can be masked, so that the model
  learns when to end), max(1, round((n + 1) * mask_prob)) of them chosen at random and replaced as
  BERT does; `labels` [B, target_length]: the chosen positions' tokens, -1 elsewhere. The source
  block is unchanged. UniLM also caps the chosen tokens per example (`max_pred`); the cap is left
  out here: at its settings (0.7 of at most 48 target tokens, max_pred 48) it never binds."""
  labels = batch["labels"]
  target_length = labels.shape[1] - 1
  source_length = batch["input_ids"].shape[1] - target_length
  targets = labels[:, :target_length]  # t_1 .. t_n [SEP], then -1
  real = targets >= 0
  count = jnp.maximum(1, jnp.round(real.sum(axis=1) * mask_prob)).astype(jnp.int32)
  pick_rng, how_rng, word_rng = jax.random.split(rng, 3)
  scores = jnp.where(real, jax.random.uniform(pick_rng, targets.shape), 2.0)  # padding ranks last
  chosen = jnp.argsort(jnp.argsort(scores, axis=1), axis=1) < count[:, None]
  how = jax.random.uniform(how_rng, targets.shape)
  random_tokens = jax.random.randint(word_rng, targets.shape, 0, vocab_size)
  fed = jnp.where(real, targets, pad_id)
  fed = jnp.where(chosen & (how < _AS_MASK), mask_id, fed)
  fed = jnp.where(chosen & (how >= _AS_MASK) & (how < _AS_MASK + _AS_RANDOM), random_tokens, fed)
  mask = batch["attention_mask"]
  return {
    **batch,
    "input_ids": batch["input_ids"].at[:, source_length:].set(fed.astype(batch["input_ids"].dtype)),
    "attention_mask": mask.at[:, source_length:].set(real.astype(mask.dtype)),
    "labels": jnp.where(chosen, targets, -1),
  }


def check_lengths(config):
  s = config.seq2seq
  if not 0 < s.target_length <= config.max_seq_length - 3:
    raise UserError(
      f"seq2seq.target_length={s.target_length} must be positive and leave room for the source in "
      f"max_seq_length={config.max_seq_length} (at least 3 tokens: [CLS] x [SEP])"
    )
  if not 0 <= s.min_target_length <= s.target_length:
    raise UserError(f"seq2seq.min_target_length={s.min_target_length} must lie in [0, target_length={s.target_length}]")
  if s.beam_size < 1:
    raise UserError(f"seq2seq.beam_size={s.beam_size} must be at least 1 (1: greedy decoding)")
  if not 0 <= s.label_smoothing < 1:
    raise UserError(f"seq2seq.label_smoothing={s.label_smoothing} must lie in [0, 1)")
  if not 0 <= mask_prob(config) < 1:
    raise UserError(f"seq2seq.mask_prob={s.mask_prob} must lie in [0, 1) (0: the one-pass form; UniLM's: 0.7)")
  if mask_prob(config) > 0 and s.target_length < 2:
    raise UserError(
      f"seq2seq.mask_prob={s.mask_prob} puts the end token in the target block, which needs "
      f"seq2seq.target_length >= 2 (it is {s.target_length})"
    )


def _text_lines(path: str) -> list:
  """The lines of a UTF-8 text file (one line naming the file when it is not text)."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f]
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (byte {e.start}): give one example per line, saved as UTF-8") from None
  if any("\0" in line for line in lines):
    raise UserError(f"{path} holds NUL bytes: it is not a text file; give one example per line")
  return lines


def _read_lines(source_path: str, target_path: str) -> datasets.Dataset:
  sources, targets = _text_lines(source_path), _text_lines(target_path)
  if len(sources) != len(targets):
    raise UserError(
      f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}: the files must pair line by line"
    )
  if not sources:
    raise UserError(f"{source_path} is empty: give one source text per line")
  return datasets.Dataset.from_dict(
    {
      "id": [str(i) for i in range(len(sources))],
      "source": sources,
      "source_b": [None] * len(sources),
      "target": targets,
    }
  )


def _read_jsonl(path: str, field_pairs: tuple) -> datasets.Dataset:
  rows: dict[str, list] = {c: [] for c in _COLUMNS}
  for line_number, line in enumerate(_text_lines(path), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{path}:{line_number}: not JSON ({e.msg})") from None
    fields = next((pair for pair in field_pairs if isinstance(row, dict) and all(k in row for k in pair)), None)
    if fields is None:
      raise UserError(f"{path}:{line_number}: needs the fields {' or '.join('/'.join(p) for p in field_pairs)}")
    rows["id"].append(str(row.get("id", len(rows["id"]))))
    rows["source"].append(str(row[fields[0]]))
    rows["source_b"].append(None)
    rows["target"].append(str(row[fields[1]]))
  if not rows["id"]:
    raise UserError(f"{path} has no examples")
  return datasets.Dataset.from_dict(rows)


@dataclasses.dataclass(frozen=True)
class QuestionGeneration(Seq2SeqTask):
  """SQuAD 1.1 JSON (or line files, e.g. Du and Cardie's split): one example per question, the
  source its passage (`seq2seq.qg_context=paragraph`) or the passage's sentence holding the answer
  (`sentence`), then the answer."""

  def load(self, split: str, data_dir: str = "", language: str = "", config=None) -> datasets.Dataset:
    context = "paragraph" if config is None else config.seq2seq.qg_context
    if context not in QG_CONTEXTS:
      raise UserError(f"seq2seq.qg_context={context!r}: use {' or '.join(QG_CONTEXTS)}")
    if data_dir:
      for name in (f"{split}.json", f"{split}-v1.1.json"):
        if os.path.isfile(os.path.join(data_dir, name)):
          return _squad_questions(os.path.join(data_dir, name), context)
      return super().load(split, data_dir, language, config)
    if split not in ("train", "dev"):
      raise UserError(f"qg has the splits train and dev, not {split!r}")
    try:
      raw = datasets.load_dataset("rajpurkar/squad", split=split.replace("dev", "validation"))
    except Exception as e:  # offline, ...
      raise UserError(
        f"qg: could not load rajpurkar/squad from the hub ({type(e).__name__}): set data_dir ({self._formats()})"
      ) from None
    rows = [
      (r["id"], r["context"], r["answers"]["text"][0], r["answers"]["answer_start"][0], r["question"]) for r in raw
    ]
    check_spans("rajpurkar/squad", (row[:4] for row in rows))
    return _questions(rows, context)

  def _formats(self) -> str:
    return f"SQuAD 1.1 JSON (<split>.json or train-v1.1.json/dev-v1.1.json), or {super()._formats()}"


def _squad_questions(path: str, context: str) -> datasets.Dataset:
  try:
    with open(path, encoding="utf-8") as f:
      articles = json.load(f)["data"]
    rows = [
      (qa["id"], p["context"], qa["answers"][0]["text"], qa["answers"][0]["answer_start"], qa["question"])
      for a in articles
      for p in a["paragraphs"]
      for qa in p["qas"]
      if qa.get("answers")
    ]
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (byte {e.start}): save the SQuAD JSON file as UTF-8") from None
  except (KeyError, TypeError, IndexError, json.JSONDecodeError) as e:
    raise UserError(
      f"{path} is not a SQuAD 1.1 JSON file ({type(e).__name__}: {e}): expected data/paragraphs/qas with answers"
    ) from None
  if not rows:
    raise UserError(f"{path} has no answered questions")
  check_spans(path, (row[:4] for row in rows))
  return _questions(rows, context)


def _questions(rows: list, context: str) -> datasets.Dataset:
  out: dict[str, list] = {c: [] for c in _COLUMNS}
  for qid, passage, answer, start, question in rows:
    out["id"].append(qid)
    out["source"].append(QG_CONTEXTS[context](passage, start))
    out["source_b"].append(answer)
    out["target"].append(question)
  return datasets.Dataset.from_dict(out)


def _sentence_at(passage: str, char: int) -> str:
  """The sentence of `passage` holding character `char` (sentences end at . ! or ? before a space)."""
  start = 0
  for match in re.finditer(r"(?<=[.!?])\s+", passage):
    if match.start() > char:
      return passage[start : match.start()]
    start = match.end()
  return passage[start:]


# seq2seq.qg_context -> (passage, the answer's first character) -> the question's source text.
QG_CONTEXTS = {"paragraph": lambda passage, start: passage, "sentence": _sentence_at}


@dataclasses.dataclass(frozen=True)
class DefinitionModelling(Seq2SeqTask):
  """WordNet 3.0 (`apt-get install wordnet-base`): for each noun and verb synset with an example
  sentence, "word : example" -> the definition; the split by the synset's offset, as the WordNet
  classification tasks; 3,000 training and 300 dev examples."""

  def load(self, split: str, data_dir: str = "", language: str = "", config=None) -> datasets.Dataset:
    sizes = {"train": 3000, "dev": 300}
    if split not in sizes:
      raise UserError(f"{self.name} has the splits train and dev, not {split!r}")
    out: dict[str, list] = {c: [] for c in _COLUMNS}
    for pos in ("noun", "verb"):
      for s in wordnet_db.read_synsets(data_dir, pos):
        if s.examples and wordnet_db.split_of(s.offset) == split:
          out["id"].append(f"{pos}.{s.offset}")
          out["source"].append(f"{s.words[0]} : {s.examples[0]}")
          out["source_b"].append(None)
          out["target"].append(s.definition)
    order = np.random.default_rng(zlib.crc32(split.encode())).permutation(len(out["id"]))[: sizes[split]]
    return datasets.Dataset.from_dict({k: [v[i] for i in order] for k, v in out.items()})


TASKS = {
  t.name: t
  for t in (
    QuestionGeneration("qg", ("bleu4", "meteor", "rougeL")),
    Seq2SeqTask(
      "cnndm",
      ("rouge1", "rouge2", "rougeL"),
      ("abisee/cnn_dailymail", "3.0.0", "article", "highlights"),
      field_names=("article", "highlights"),
    ),
    Seq2SeqTask(
      "xsum",
      ("rouge1", "rouge2", "rougeL"),
      ("EdinburghNLP/xsum", None, "document", "summary"),
      field_names=("document", "summary"),
    ),
    DefinitionModelling("wordnet_definitions", ("rougeL", "bleu4", "meteor")),
  )
}
