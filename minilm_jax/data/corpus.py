"""Pre-training corpus -> BERT-style blocks `[CLS] s1 s2 ... [SEP]` -> a deterministic, resumable batch stream.

Rows of a text corpus are sentences (or paragraphs) and an empty row ends a document, as in BERT's
pre-training files; rows of other corpora (JSON, Parquet, the hub's Wikipedia) are whole documents,
split into sentences (`data.rows`). Consecutive sentences of a document are packed into one block
until the next would overflow `max_seq_length`; no block holds two documents. Tokenisation
and packing are batched `datasets.map` calls, cached by `datasets`.
"""

import contextlib
import hashlib
import inspect
import logging
import os
import re

import datasets
import numpy as np
import pyarrow as pa

from minilm_jax.data.demo_corpus import write_demo_corpus, write_wordnet_corpus
from minilm_jax.errors import UserError

# data.corpus names of the corpora that ship with the package (data/demo_corpus.py) -> their writer
BUILT_IN = {"demo": write_demo_corpus, "wordnet": write_wordnet_corpus}
_BUILDERS = {".txt": "text", ".text": "text", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def _load_raw(corpus: str, subset: str, cache_dir: str) -> datasets.Dataset:
  if corpus in BUILT_IN:
    files = [BUILT_IN[corpus](os.path.join(cache_dir, f"{corpus}_corpus.txt"))]
  else:
    files = [f.strip() for f in corpus.split(",") if f.strip()]
  local = [f for f in files if os.path.splitext(f)[1] in _BUILDERS or os.path.exists(f)]
  if not local:  # a hub dataset name
    try:
      return datasets.load_dataset(corpus, subset or None, split="train")
    except Exception as e:  # offline, unknown name, ...: the hub's exception types vary by version
      raise UserError(
        f"data.corpus={corpus!r} is not a local file and could not be loaded from the hub "
        f"({type(e).__name__}): pass local .txt/.json/.jsonl/.parquet files"
      ) from None
  for f in files:
    if not os.path.isfile(f):
      raise UserError(f"corpus file {f} does not exist: fix data.corpus")
  builders = {_BUILDERS.get(os.path.splitext(f)[1], "text") for f in files}
  if len(builders) > 1:
    raise UserError(f"data.corpus mixes file kinds {sorted(builders)}: use files of one kind")
  builder = builders.pop()
  if builder == "json":
    for f in files:
      _check_json_start(f)
  with datasets_errors_unlogged():
    try:
      raw = datasets.load_dataset(builder, data_files=files, split="train")
    except Exception as e:
      raise UserError(f"could not read corpus {corpus}: {root_cause(e)}: fix or remove the file") from None
  _check_utf8(raw, corpus)
  return raw


def _check_utf8(dataset: datasets.Dataset, corpus: str):
  """pyarrow's JSON and CSV readers take a string's bytes without checking that they are UTF-8, so
  a bad byte inside a value would surface only when tokenising reaches its row, as a traceback from
  deep inside `datasets`. Arrow's full validation checks every string column here, in C++."""
  for name, column in zip(dataset.column_names, dataset.data.table.columns):
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
      continue
    first_row = 0
    for chunk in column.chunks:
      try:
        chunk.validate(full=True)
      except pa.ArrowInvalid as e:
        index = re.search(r"index (\d+)", str(e))
        where = f"row {first_row + int(index.group(1)) + 1}" if index else f"a row after row {first_row}"
        raise UserError(
          f"could not read corpus {corpus}: column {name!r} is not UTF-8 text at {where}: fix or remove the file"
        ) from None
      first_row += len(chunk)


@contextlib.contextmanager
def datasets_errors_unlogged():
  """A file `datasets` cannot read comes back to the caller as one UserError; `datasets` would also
  log the failure (at ERROR: "Failed to read schema from ...") on the way, a second line."""
  datasets_logger = logging.getLogger("datasets")
  level = datasets_logger.level
  datasets_logger.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    datasets_logger.setLevel(level)


def _check_json_start(path: str):
  """A JSON corpus holds objects, one per line (or one array of them). pyarrow's reader, which
  `datasets` uses, crashes the process on some other documents (a file holding `null`), so
  anything else is refused before it gets there."""
  with open(path, "rb") as f:
    start = f.read(4096).lstrip()[:1]
  if start and start not in b"{[":
    raise UserError(
      f"could not read corpus {path}: it is not JSON objects (it starts with {start!r}, not '{{'): "
      f"write one object per line, like {{\"text\": \"...\"}}"
    )


def map_fingerprint(dataset: datasets.Dataset, fn, depends_on: tuple | None = None) -> str | None:
  """`new_fingerprint` for `dataset.map(fn, ...)`. A dataset held in memory (every reader of local
  files builds one) writes no cache file, so its fingerprint only has to be new. A dataset on disk
  (the hub's, a corpus read by `datasets`) needs one that names its map's output, so that its cache
  file is found again: `datasets` hashes `fn`, dill-pickling the tokenizer it closes over (0.8 s a
  call on BERT's 30,522 pieces). Given `depends_on` (everything the output depends on besides the
  rows and the code: a fast tokenizer, lengths, flags), it is hashed from those instead, with the
  source of `fn`'s file (a change to the code maps again) and the dataset's own fingerprint, in
  moments. A tokenizer without a serialised form (a slow one) leaves the hash to `datasets`."""
  if not dataset.cache_files:
    return datasets.fingerprint.generate_random_fingerprint()
  if depends_on is None:
    return None
  digest = hashlib.sha256(dataset._fingerprint.encode())
  with open(inspect.getfile(fn), "rb") as code:
    digest.update(code.read())
  for value in depends_on:
    if hasattr(value, "get_vocab"):  # a tokenizer: its whole state, from the fast tokenizer's JSON
      if not getattr(value, "is_fast", False):
        return None
      value = (value.backend_tokenizer.to_str(), sorted(value.special_tokens_map.items()), value.padding_side)
    digest.update(repr(value).encode())
  # 32 hex digits: `datasets` appends a worker's rank to it under num_proc, within its 64 characters.
  return digest.hexdigest()[:32]


def map_batches(dataset: datasets.Dataset, fn, desc: str, depends_on: tuple | None = None, **map_kwargs):
  """`dataset.map(fn, batched=True)` whose output replaces every column (tokenising, windowing,
  packing), with the fingerprint `map_fingerprint` chooses."""
  return dataset.map(
    fn,
    batched=True,
    remove_columns=dataset.column_names,
    desc=desc,
    new_fingerprint=map_fingerprint(dataset, fn, depends_on),
    **map_kwargs,
  )


def root_cause(error: Exception) -> str:
  """What went wrong underneath `datasets`' generic DatasetGenerationError: the first cause that
  says more than "an error occurred" (a JSON parse error with its row, a byte that is not UTF-8,
  an empty file)."""
  causes: list[BaseException] = []
  e: BaseException | None = error
  while e is not None and len(causes) < 8:
    causes.append(e)
    e = e.__cause__ or e.__context__
  telling = [c for c in causes if type(c).__name__ != "DatasetGenerationError"] or causes
  c = telling[0]
  if isinstance(c, UnicodeDecodeError):
    return f"it is not UTF-8 text (byte {c.object[c.start : c.start + 1]!r} at offset {c.start})"
  # An empty file, or JSON with no objects: `datasets` says so in several ways.
  if type(c).__name__ in ("SchemaInferenceError", "StopIteration") or "corresponds to no data" in str(c):
    return "it holds no rows"
  return f"{type(c).__name__}: {' '.join(str(c).split())[:200]}"


# A sentence ends at ., ! or ? (possibly closed by a quote or bracket) followed by white space and
# an upper-case letter, digit or opening quote: a rule, not a trained splitter (NLTK's punkt needs a
# download); abbreviations such as "e.g. the" stay inside their sentence.
_SENTENCE_END = re.compile(r"([.!?][\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list:
  parts = _SENTENCE_END.split(text)  # text, its end, text, its end, ..., the last text
  sentences = [body + end for body, end in zip(parts[::2], parts[1::2] + [""])]
  return [s.strip() for s in sentences if s.strip()]


def first_sentences(data_config, cache_dir: str, n: int) -> list:
  """The corpus's first `n` sentences (ETD-Impt scores its neurons over the first 10,000 sentences
  of the training data), each row (a line or a whole document) split into its sentences."""
  raw = _load_raw(data_config.corpus, data_config.corpus_config, cache_dir)
  sentences = []
  for text in raw[data_config.text_column]:
    if isinstance(text, str):
      sentences.extend(split_sentences(text))
      if len(sentences) >= n:
        return sentences[:n]
  return sentences


def pack_blocks(token_rows, block_len: int):
  """Packs consecutive rows of token ids into blocks of at most `block_len` ids. An empty row ends a
  document (no block spans two documents); a row longer than a block is cut into whole blocks."""
  blocks: list[list[int]] = []
  current: list[int] = []
  for ids in token_rows:
    if not ids:
      if current:
        blocks.append(current)
      current = []
      continue
    if current and len(current) + len(ids) > block_len:
      blocks.append(current)
      current = []
    while len(ids) > block_len:
      blocks.append(ids[:block_len])
      ids = ids[block_len:]
    current = current + ids
  if current:
    blocks.append(current)
  return blocks


# data.rows -> whether each row is a whole document (None, "auto": every corpus but text files).
ROW_KINDS = {"auto": None, "lines": False, "documents": True}


def rows_are_documents(data_config) -> bool:
  """Whether each row of the corpus is a whole document (`data.rows`; "auto": every corpus but text files)."""
  rows = data_config.get("rows", "auto")
  if rows not in ROW_KINDS:
    raise UserError(f"data.rows={rows!r}: choose one of {', '.join(ROW_KINDS)}")
  documents = ROW_KINDS[rows]
  if documents is not None:
    return documents
  files = [f.strip() for f in data_config.corpus.split(",") if f.strip()]
  return data_config.corpus not in BUILT_IN and not all(_is_text_file(f) for f in files)


def _is_text_file(path: str) -> bool:
  """Read as text by `_load_raw`: a .txt/.text file, or a local file of an extension it does not know."""
  extension = os.path.splitext(path)[1]
  return _BUILDERS.get(extension) == "text" or (extension not in _BUILDERS and os.path.isfile(path))


def document_sentences(texts) -> list:
  """Rows that are documents -> rows of sentences, an empty row after each document."""
  rows = []
  for text in texts:
    rows.extend(split_sentences(text))
    rows.append("")
  return rows


def load_blocks(data_config, tokenizer, cache_dir: str) -> datasets.Dataset:
  """The corpus as a dataset with one column `input_ids`: packed blocks with [CLS] ... [SEP]."""
  documents = rows_are_documents(data_config)
  raw = _load_raw(data_config.corpus, data_config.corpus_config, cache_dir)
  column = data_config.text_column
  if column not in raw.column_names:
    raise UserError(
      f"corpus {data_config.corpus} has no column {column!r} (it has {raw.column_names}): set data.text_column"
    )
  block_len = data_config.max_seq_length - 2
  cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
  if cls_id is None or sep_id is None:  # RoBERTa-style tokenizers name them bos/eos
    cls_id, sep_id = tokenizer.bos_token_id, tokenizer.eos_token_id

  def tokenize_and_pack(batch):
    texts = [t if isinstance(t, str) else "" for t in batch[column]]
    if documents:
      texts = document_sentences(texts)
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return {"input_ids": [[cls_id] + b + [sep_id] for b in pack_blocks(ids, block_len)]}

  blocks = map_batches(
    raw,
    tokenize_and_pack,
    "tokenise and pack",
    depends_on=(tokenizer, column, documents, block_len, cls_id, sep_id),
    batch_size=1000,
    num_proc=data_config.num_proc if data_config.num_proc > 1 else None,
  )
  return blocks


def pad_blocks(rows: dict, seq_len: int, pad_id: int) -> dict:
  """Packed blocks -> BERT inputs of length `seq_len` (padding masked out)."""
  blocks = rows["input_ids"]
  ids = np.full((len(blocks), seq_len), pad_id, np.int32)
  mask = np.zeros((len(blocks), seq_len), np.int32)
  for j, row in enumerate(blocks):
    ids[j, : len(row)] = row
    mask[j, : len(row)] = 1
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def stack_columns(rows: dict) -> dict:
  """Fixed-length features (already padded) -> one array per column."""
  return {k: np.asarray(v) for k, v in rows.items()}


class RowRange:
  """Rows [start, stop) of a corpus's blocks, indexed as the blocks are (what a `BatchStream` reads)."""

  def __init__(self, rows, start: int, stop: int):
    self.rows, self.start, self.stop = rows, start, stop

  def __len__(self) -> int:
    return self.stop - self.start

  def __getitem__(self, indices):
    return self.rows[np.asarray(indices) + self.start]


def split_heldout(blocks, count: int, batch_size: int):
  """(training rows, held-out rows or None): the corpus's last `count` blocks are held out, the
  same ones on every process and at every restart; at least one batch of them when any."""
  if not count:
    return blocks, None
  if count < batch_size or count >= len(blocks):
    raise UserError(
      f"data.heldout_blocks={count} of the corpus's {len(blocks)} blocks: hold out at least one batch "
      f"({batch_size}) and leave the rest for training"
    )
  if hasattr(blocks, "split_tail"):  # languages.LanguageBlocks: every language gives its share
    return blocks.split_tail(count)
  return RowRange(blocks, 0, len(blocks) - count), RowRange(blocks, len(blocks) - count, len(blocks))


class BatchStream:
  """Global batch `b` is a fixed function of (seed, b): the stream resumes at any batch index
  without replaying earlier ones. Each epoch is a fresh permutation of the rows (the last partial
  batch of an epoch is dropped); each process reads only its own rows of every global batch, and
  `collate` turns them into arrays. Rows with an `epoch_order(seed, epoch)` (a corpus in several
  languages, `languages.LanguageBlocks`) give each epoch's order themselves, sampled by language."""

  def __init__(
    self,
    rows: datasets.Dataset,
    global_batch: int,
    seed: int,
    collate,
    process_index: int = 0,
    process_count: int = 1,
    name: str = "",
  ):
    if len(rows) < global_batch:
      raise UserError(
        f"{name} gives {len(rows)} examples, fewer than one batch of {global_batch}: add data or lower the batch size"
      )
    self.rows, self.global_batch, self.seed, self.collate = rows, global_batch, seed, collate
    self.local_batch = global_batch // process_count
    self.offset = process_index * self.local_batch
    self.batches_per_epoch = len(rows) // global_batch
    self._epoch: int | None = None
    self._order: np.ndarray = np.arange(0)

  def indices(self, b: int) -> np.ndarray:
    """Row indices of this process's part of global batch `b`."""
    epoch, i = divmod(b, self.batches_per_epoch)
    if epoch != self._epoch:
      order = getattr(self.rows, "epoch_order", None)
      self._epoch = epoch
      self._order = (
        order(self.seed, epoch) if order else np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
      )
    start = i * self.global_batch + self.offset
    return self._order[start : start + self.local_batch]

  def batch(self, b: int) -> dict:
    return self.collate(self.rows[self.indices(b)])


class MultiTaskStream:
  """MKD's batches (thesis algorithm 1): every task's batches, merged and shuffled each epoch.

  Each task keeps its own `BatchStream` (a fresh permutation of its rows every epoch); global batch
  `b` is a fixed function of (seed, b) as there, and carries its task's name under "task".
  """

  def __init__(self, streams: dict, seed: int):
    self.streams, self.seed = streams, seed
    self.plan = [(task, i) for task, s in streams.items() for i in range(s.batches_per_epoch)]
    self.batches_per_epoch = len(self.plan)
    self._epoch: int | None = None
    self._order: np.ndarray = np.arange(0)

  def batch(self, b: int) -> dict:
    epoch, i = divmod(b, self.batches_per_epoch)
    if epoch != self._epoch:
      self._epoch, self._order = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.batches_per_epoch)
    task, j = self.plan[self._order[i]]
    stream = self.streams[task]
    return {**stream.batch(epoch * stream.batches_per_epoch + j), "task": task}
