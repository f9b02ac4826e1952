"""`task=custom`: the user's own sentence(-pair) classification or regression data, defined by the
config alone (`data.train`, `data.dev`, `data.text_columns`, `data.label_column`, ...), read from
CSV, TSV, JSON Lines or Parquet files through `datasets`. Class names are the training file's
label values (sorted), unless `data.labels` lists them; the run's head keeps them, so evaluation
and the exported `transformers` model name the same classes."""

import dataclasses
import os

import datasets

from minilm_jax.data.corpus import datasets_errors_unlogged, root_cause
from minilm_jax.errors import UserError
from minilm_jax.tasks.glue import ClassificationTask, example_columns
from minilm_jax.tasks.metrics import METRICS

# File suffix -> (`datasets` builder, its options).
_READERS = {
  ".csv": ("csv", {}),
  ".tsv": ("csv", {"delimiter": "\t"}),
  ".json": ("json", {}),
  ".jsonl": ("json", {}),
  ".parquet": ("parquet", {}),
}
_DEFAULT_METRICS = {False: ("accuracy", "macro_f1"), True: ("pearson", "spearman")}


def read_table(path: str, what: str) -> datasets.Dataset:
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in _READERS:
    raise UserError(f"{what}={path!r}: use a .csv, .tsv, .json, .jsonl or .parquet file")
  if not os.path.isfile(path):
    raise UserError(f"{what}={path!r} does not exist: fix the path")
  builder, options = _READERS[suffix]
  with datasets_errors_unlogged():
    try:
      return datasets.load_dataset(builder, data_files=path, split="train", **options)
    except Exception as e:  # a malformed file: `datasets` wraps the parser's error
      raise UserError(f"{what}={path!r} could not be read ({root_cause(e)}): fix the file") from None


@dataclasses.dataclass(frozen=True)
class CustomTask(ClassificationTask):
  files: tuple = ()  # ((split, path), ...)

  def load(self, split: str, data_dir: str = "", language: str = "") -> datasets.Dataset:
    path = dict(self.files).get(split)
    if not path:
      raise UserError(f"the custom task has no {split} file: set --config.data.{split}")
    raw = read_table(path, f"data.{split}")
    needed = list(self.text_columns) + [self.label_column]
    missing = [c for c in needed if c not in raw.column_names]
    if missing:
      raise UserError(
        f"{path} has no column(s) {missing} (it has {raw.column_names}): set data.text_columns and data.label_column"
      )
    out = example_columns()
    for i, row in enumerate(raw):
      out["text_a"].append(str(row[self.text_columns[0]]))
      out["text_b"].append(str(row[self.text_columns[1]]) if len(self.text_columns) > 1 else None)
      out["label"].append(self._label(str(row[self.label_column]), path, f"row {i + 1}"))
      out["idx"].append(i)
      out["group"].append("")
    return datasets.Dataset.from_dict(out)


def custom_task(data) -> CustomTask:
  """The task `data` (the config's `data` fields) defines; class names from the training file
  unless `data.labels` lists them."""
  if not data.train or not data.dev:
    raise UserError("task=custom needs --config.data.train and --config.data.dev (CSV, TSV, JSON Lines or Parquet)")
  text_columns = tuple(c.strip() for c in data.text_columns.split(",") if c.strip())
  if not 1 <= len(text_columns) <= 2:
    raise UserError(f"data.text_columns={data.text_columns!r}: name one column, or two for sentence pairs")
  metrics = tuple(m.strip() for m in data.metrics.split(",") if m.strip()) or _DEFAULT_METRICS[data.regression]
  unknown = [m for m in metrics if m not in METRICS]
  if unknown:
    raise UserError(f"data.metrics names {unknown}: choose from {', '.join(METRICS)}")
  labels = None
  if not data.regression:
    labels = tuple(l.strip() for l in data.labels.split(",") if l.strip())
    if not labels:
      train = read_table(data.train, "data.train")
      if data.label_column not in train.column_names:
        raise UserError(
          f"{data.train} has no column {data.label_column!r} (it has {train.column_names}): set data.label_column"
        )
      labels = tuple(sorted({str(v) for v in train[data.label_column]}, key=_numbers_first))
    if len(labels) < 2:
      raise UserError(
        f"the custom task has {len(labels)} class ({list(labels)}"
        + (f", the label values of {data.train}" if not data.labels else "")
        + "): a classifier needs at least 2; set data.regression=True for scores"
      )
  return CustomTask(
    "custom",
    text_columns,
    data.label_column,
    labels,
    metrics,
    ("", ""),
    (),
    files=(("train", data.train), ("dev", data.dev)),
  )


def _numbers_first(value: str):
  """Numeric class names in numeric order (2 before 10), then the others alphabetically."""
  try:
    return (0, float(value), "")
  except ValueError:
    return (1, 0.0, value)
