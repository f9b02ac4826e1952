"""GLUE (all nine tasks) and XNLI: sentence(-pair) classification or regression on [CLS].

Data: the original GLUE TSV files in a task folder (`train.tsv`, `dev.tsv`, `test.tsv`; MNLI's
`dev_matched.tsv`/`dev_mismatched.tsv`), XNLI's TSV files, or (when online) the Hugging Face hub.
Every split becomes a `datasets.Dataset` with `text_a`, `text_b`, `label` (class index, score,
or -1 for unlabelled test rows), `idx` and `group` (XNLI's language, else empty).
"""

import csv
import dataclasses
import os
import zlib

import datasets
import jax.numpy as jnp
import numpy as np
import optax

from minilm_jax.data.corpus import map_batches
from minilm_jax.errors import UserError
from minilm_jax.models.heads import CLASSIFICATION
from minilm_jax.tasks.metrics import METRICS

csv.field_size_limit(1 << 24)  # some GLUE rows (QQP, MNLI parses) exceed csv's default field size


def example_columns() -> dict[str, list]:
  """A classification task's examples as columns, empty (`text_b` None for single sentences)."""
  return {"text_a": [], "text_b": [], "label": [], "idx": [], "group": []}


def fixed_subset(rows: dict, split: str, size: int) -> datasets.Dataset:
  """A fixed, shuffled subset of `size` rows of `example_columns` (every row when fewer): the
  small-data tasks' splits, the same on every machine."""
  order = np.random.default_rng(zlib.crc32(split.encode())).permutation(len(rows["label"]))[:size]
  return datasets.Dataset.from_dict({k: [v[i] for i in order] for k, v in rows.items()})


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
  name: str
  text_columns: tuple  # TSV header names of the one or two texts
  label_column: str  # TSV header name of the label (train and dev files)
  labels: tuple | None  # class names as written in the TSV; None: regression
  metrics: tuple  # official metrics; the first is the one a grid search maximises
  hub: tuple  # (dataset, subset) on the Hugging Face hub
  hub_text_columns: tuple
  eval_splits: tuple = ("dev",)
  submission_names: tuple = ()  # GLUE submission file per test split
  headerless_columns: tuple = ()  # CoLA's train/dev files have no header row
  group_column: str = ""  # XNLI: accuracy per language as well

  @property
  def test_splits(self):
    """GLUE's unlabelled test splits, scored by submission files; a task without a submission
    format (XNLI, whose test set is labelled) has none."""
    return tuple(s.replace("dev", "test") for s in self.eval_splits) if self.submission_names else ()

  def head(self, config=None) -> dict:
    return {
      "kind": CLASSIFICATION,
      "num_labels": len(self.labels) if self.labels else 1,
      "labels": list(self.labels) if self.labels else None,
    }

  # --- data -------------------------------------------------------------------------------------

  def load(self, split: str, data_dir: str = "", language: str = "") -> datasets.Dataset:
    if data_dir:
      return self.load_file(os.path.join(data_dir, f"{split}.tsv"), labelled=split not in self.test_splits)
    return self._load_hub(split, language)

  def load_file(self, path: str, labelled: bool) -> datasets.Dataset:
    if not os.path.isfile(path):
      raise UserError(f"{self.name}: data file {path} does not exist: set data_dir to the task's GLUE folder")
    try:
      with open(path, encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except UnicodeDecodeError as e:
      raise UserError(f"{path} is not UTF-8 text (byte {e.start}): save the {self.name} file as UTF-8") from None
    except csv.Error as e:  # a NUL byte
      raise UserError(f"{path} is not a tab-separated text file ({e}): give the task's GLUE file") from None
    if not rows:
      raise UserError(f"{path} is empty: give the task's GLUE file (a header line, then one example per line)")
    if self.headerless_columns and labelled:
      header = list(self.headerless_columns)
    else:
      header, rows = rows[0], rows[1:]
    needed = list(self.text_columns) + ([self.label_column] if labelled else [])
    missing = [c for c in needed if c not in header]
    if missing:
      raise UserError(f"{path} lacks columns {missing} of a {self.name} file (it has {header})")
    position = {c: header.index(c) for c in header}
    out = example_columns()
    for line, row in enumerate(rows, start=2 - bool(self.headerless_columns and labelled)):
      if len(row) < len(header):
        raise UserError(f"{path}:{line}: {len(row)} fields where the header has {len(header)}: the file is malformed")
      out["text_a"].append(row[position[self.text_columns[0]]])
      out["text_b"].append(row[position[self.text_columns[1]]] if len(self.text_columns) > 1 else None)
      out["label"].append(self._label(row[position[self.label_column]], path, line) if labelled else -1)
      out["idx"].append(
        int(row[position["index"]])
        if "index" in position
        else int(row[position["id"]])
        if "id" in position
        else line - 2
      )
      # XNLI's dev/test files name each row's language; its MNLI-format training file does not.
      out["group"].append(row[position[self.group_column]] if self.group_column in position else "")
    return datasets.Dataset.from_dict(out)

  def _label(self, value: str, path: str, line: int | str):
    if self.labels is None:
      try:
        return float(value)
      except ValueError:
        raise UserError(f"{path}:{line}: score {value!r} is not a number") from None
    if value not in self.labels:
      raise UserError(f"{path}:{line}: unknown {self.name} label {value!r}: expected one of {list(self.labels)}")
    return self.labels.index(value)

  def _load_hub(self, split: str, language: str) -> datasets.Dataset:
    name, subset = self.hub
    hub_split = split.replace("dev", "validation")
    try:
      raw = datasets.load_dataset(name, language or subset, split=hub_split)
    except Exception as e:  # offline, unknown split, ...: the hub's exception types vary by version
      raise UserError(
        f"{self.name}: could not load {name}/{language or subset} split {hub_split} from the hub "
        f"({type(e).__name__}): set data_dir to a folder of the task's TSV files"
      ) from None
    names = raw.features["label"].names if hasattr(raw.features["label"], "names") else None
    a, b = (self.hub_text_columns + (None,))[:2]

    def convert(row, i):
      label = row["label"]
      if self.labels is not None and label >= 0:
        label = self.labels.index(names[label]) if names else label
      return {
        "text_a": row[a],
        "text_b": row[b] if b else None,
        "label": label,
        "idx": row.get("idx", i),
        "group": language,
      }

    return raw.map(convert, with_indices=True, remove_columns=raw.column_names)

  def features(self, dataset: datasets.Dataset, tokenizer, max_len: int) -> datasets.Dataset:
    def tokenize(batch):
      pair = batch["text_b"] if self.text_columns[1:] else None
      enc = tokenizer(batch["text_a"], pair, truncation=True, max_length=max_len, padding="max_length")
      out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "label": batch["label"]}
      out["token_type_ids"] = enc.get("token_type_ids", [[0] * max_len for _ in batch["label"]])
      return out

    return map_batches(dataset, tokenize, f"tokenise {self.name}")

  # --- model side -------------------------------------------------------------------------------

  train_columns = ("input_ids", "attention_mask", "token_type_ids", "label")

  def prepare(self, split: str, config, tokenizer):
    """(features for the model, the examples they came from) of a split."""
    examples = self.load(split, config.data_dir, config.language)
    return self.features(examples, tokenizer, config.max_seq_length), examples

  def loss(self, logits_BxC, batch, config=None):
    """Cross-entropy (classification) or MSE (regression), averaged over the batch."""
    if self.labels is None:
      return jnp.mean((logits_BxC[:, 0] - batch["label"]) ** 2)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits_BxC, batch["label"].astype(jnp.int32)))

  def predict(self, logits_NxC) -> np.ndarray:
    return logits_NxC[:, 0] if self.labels is None else np.argmax(logits_NxC, axis=-1)

  def evaluate(self, logits_NxC, features, examples, config=None):
    """(metrics, predictions) of a labelled split."""
    predictions = self.predict(logits_NxC)
    return self.score(predictions, examples), predictions

  def score(self, predictions, dataset: datasets.Dataset) -> dict:
    labels = np.asarray(dataset["label"])
    scores = {m: METRICS[m](labels, predictions) for m in self.metrics}
    if self.group_column:
      groups = np.asarray(dataset["group"])
      languages = sorted(set(groups) - {""})
      for g in languages:
        scores[f"accuracy_{g}"] = METRICS["accuracy"](labels[groups == g], predictions[groups == g])
      if len(languages) > 1:  # MiniLM table 11's "Avg": the mean over languages, each weighted alike
        scores["accuracy_average"] = float(np.mean([scores[f"accuracy_{g}"] for g in languages]))
    return scores

  def write_submission(self, predictions, dataset: datasets.Dataset, path: str):
    """The GLUE server's format: `index<TAB>prediction`, labels by name, STS-B scores clipped to [0, 5]."""
    with open(path, "w") as f:
      f.write("index\tprediction\n")
      for idx, p in zip(dataset["idx"], predictions):
        value = f"{min(max(float(p), 0.0), 5.0):.3f}" if self.labels is None else self.labels[int(p)]
        f.write(f"{idx}\t{value}\n")


_NLI = ("contradiction", "entailment", "neutral")
_RTE = ("entailment", "not_entailment")
TASKS = {
  t.name: t
  for t in (
    ClassificationTask(
      "cola",
      ("sentence",),
      "label",
      ("0", "1"),
      ("matthews",),
      ("nyu-mll/glue", "cola"),
      ("sentence",),
      submission_names=("CoLA",),
      headerless_columns=("source", "label", "original_label", "sentence"),
    ),
    ClassificationTask(
      "sst2",
      ("sentence",),
      "label",
      ("0", "1"),
      ("accuracy",),
      ("nyu-mll/glue", "sst2"),
      ("sentence",),
      submission_names=("SST-2",),
    ),
    ClassificationTask(
      "mrpc",
      ("#1 String", "#2 String"),
      "Quality",
      ("0", "1"),
      ("f1", "accuracy"),
      ("nyu-mll/glue", "mrpc"),
      ("sentence1", "sentence2"),
      submission_names=("MRPC",),
    ),
    ClassificationTask(
      "stsb",
      ("sentence1", "sentence2"),
      "score",
      None,
      ("pearson", "spearman"),
      ("nyu-mll/glue", "stsb"),
      ("sentence1", "sentence2"),
      submission_names=("STS-B",),
    ),
    ClassificationTask(
      "qqp",
      ("question1", "question2"),
      "is_duplicate",
      ("0", "1"),
      ("f1", "accuracy"),
      ("nyu-mll/glue", "qqp"),
      ("question1", "question2"),
      submission_names=("QQP",),
    ),
    ClassificationTask(
      "mnli",
      ("sentence1", "sentence2"),
      "gold_label",
      _NLI,
      ("accuracy",),
      ("nyu-mll/glue", "mnli"),
      ("premise", "hypothesis"),
      eval_splits=("dev_matched", "dev_mismatched"),
      submission_names=("MNLI-m", "MNLI-mm"),
    ),
    ClassificationTask(
      "qnli",
      ("question", "sentence"),
      "label",
      _RTE,
      ("accuracy",),
      ("nyu-mll/glue", "qnli"),
      ("question", "sentence"),
      submission_names=("QNLI",),
    ),
    ClassificationTask(
      "rte",
      ("sentence1", "sentence2"),
      "label",
      _RTE,
      ("accuracy",),
      ("nyu-mll/glue", "rte"),
      ("sentence1", "sentence2"),
      submission_names=("RTE",),
    ),
    ClassificationTask(
      "wnli",
      ("sentence1", "sentence2"),
      "label",
      ("0", "1"),
      ("accuracy",),
      ("nyu-mll/glue", "wnli"),
      ("sentence1", "sentence2"),
      submission_names=("WNLI",),
    ),
    # XNLI as MiniLM runs it: train on (English) MNLI-format data, select on XNLI's dev set and
    # report its labelled test set; both files carry a `language` column: accuracy overall and per language.
    ClassificationTask(
      "xnli",
      ("sentence1", "sentence2"),
      "gold_label",
      _NLI,
      ("accuracy",),
      ("facebook/xnli", "en"),
      ("premise", "hypothesis"),
      eval_splits=("dev", "test"),
      group_column="language",
    ),
  )
}
