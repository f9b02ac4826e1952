"""Pre-trained word vectors for the thesis's LSTM students (section 3.4.1: "Following [Kim 2014],
we use the multichannel embedding technique with 300-dimensional word2vec trained on Google News").

Formats, read from a local file: word2vec binary (`.bin`: a "count dim" header line, then per word
its bytes, a space and `dim` little-endian float32s), word2vec text (the same header, then
"word v1 ... vdim" lines; fastText's `.vec`) and GloVe text (no header). The thesis gives no more
detail; the choices made here, from Kim (2014), whose technique it follows:
- The vocabulary is the first `max_words` words of the file (these files list the most frequent
  words first) plus every word of the tasks' training sets: words of the training sets that the file
  has keep their vectors, the others start uniform in [-0.25, 0.25] (Kim's choice, about the
  variance of word2vec's vectors), as do `[UNK]` and `[MASK]` (augmentation's masking); `[PAD]` is
  zeros. Words only in the dev or test sets are `[UNK]`: nothing is learnt from them.
- Words are BERT's pre-tokenisation (split at whitespace and punctuation); lower-cased only when the
  file has no upper-case word (GloVe 6B is lower-cased, word2vec's Google News is not).
The tokenizer is a Hugging Face fast tokenizer (a word-level model of the `tokenizers` library), so
a run saves and reloads it like any other.
"""

import itertools
import logging
import os
import unicodedata

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from minilm_jax.errors import UserError

PAD, UNK, MASK = "[PAD]", "[UNK]", "[MASK]"
SPECIALS = (PAD, UNK, MASK)
_BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark
_RANDOM_SCALE = 0.25  # Kim (2014): unknown words uniform in [-a, a], a chosen to match word2vec's variance


class _Reader:
  """One vectors file read record by record, its errors naming the file and the record."""

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise UserError(f"word vectors file {path} does not exist: fix student.word_vectors")
    self.path, self.binary = path, path.endswith(".bin")
    self.cased = False  # whether any word read so far has an upper-case letter

  def fail(self, where: str, what: str):
    kind = "word2vec binary" if self.binary else "word2vec or GloVe text"
    raise UserError(f"word vectors {self.path}, {where}: {what}; is it a {kind} file?")

  def records(self):
    """The dimension, then (where, word, its vector's bytes or text values) per record; a header's
    count of vectors is held against the records the file holds."""
    with open(self.path, "rb") as f:
      first = f.readline()
      if first.startswith(_BOM):  # a legal way to write UTF-8 (Windows editors add it): not part of a word
        first = first[len(_BOM) :]
      if not first.strip():
        self.fail("line 1", "the file is empty" if not first else "the first line is empty")
      header = first.split()
      is_header = len(header) == 2 and all(h.isdigit() for h in header)
      if self.binary:
        if not is_header:
          self.fail("line 1", f"expected the header 'count dim', found {first[:40]!r}")
        count, dim = int(header[0]), int(header[1])
        yield dim
        for i in range(count):
          yield self._binary_record(f, i + 1, dim)
        if f.read(64).strip(b"\r\n"):
          self.fail(f"record {count + 1}", f"the file goes on after the {count} vectors its header counts")
        return
      dim = int(header[1]) if is_header else len(header) - 1
      yield dim
      lines = f if is_header else itertools.chain([first], f)
      count = 0
      for line_no, line in enumerate(lines, start=1 + is_header):
        if line.strip():
          count += 1
          yield self._text_record(line, line_no, dim)
      if is_header and count != int(header[0]):
        self.fail("line 1", f"the header counts {int(header[0])} vectors and the file holds {count}")

  def _binary_record(self, f, number: int, dim: int):
    word = bytearray()
    while (c := f.read(1)) != b" ":
      if not c:
        self.fail(f"record {number}", "the file ends before the header's count of words")
      if c != b"\n" or word:  # the newline some writers put after each vector
        word += c
      if len(word) > 1000:
        self.fail(f"record {number}", "no space after a word in 1000 bytes")
    values = f.read(4 * dim)
    if len(values) < 4 * dim:
      self.fail(f"record {number}", f"the file ends inside a vector ({len(values)} of {4 * dim} bytes)")
    return f"record {number}", self._word(bytes(word), f"record {number}"), values

  def _text_record(self, line: bytes, line_no: int, dim: int):
    # word2vec.c and fastText end every line with a space after the last value; files written by
    # hand or other tools put a space before the word or two between values: any run of white
    # space separates the fields, as gensim reads them.
    parts = line.split()
    if len(parts) != dim + 1:
      self.fail(f"line {line_no}", f"{len(parts) - 1} values where the file's vectors have {dim}")
    return f"line {line_no}", self._word(parts[0], f"line {line_no}"), parts[1:]

  def _word(self, raw: bytes, where: str) -> str:
    try:
      word = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      self.fail(where, f"a word that is not UTF-8 (byte {raw[e.start : e.start + 1]!r})")
    if not word or any(unicodedata.category(c) == "Cc" for c in word):
      self.fail(where, f"the word {word!r} is empty or holds a control character")
    self.cased = self.cased or word != word.lower()
    return word

  def vector(self, values, where: str) -> np.ndarray:
    if self.binary:
      vector = np.frombuffer(values, dtype="<f4")
    else:
      try:  # numpy parses the byte strings (as Python's float would) at twice float()'s speed
        with np.errstate(over="ignore"):  # a value past float32's range is refused below, in one line
          vector = np.array(values, dtype=np.float64).astype(np.float32)
      except ValueError:
        self.fail(where, "a value that is not a number")
    if not np.all(np.isfinite(vector)):
      self.fail(where, "a value that is not finite")
    return vector


def read_word_vectors(path: str, max_words: int, also: frozenset | set = frozenset()) -> tuple:
  """({word: float32 vector} of the file's first `max_words` words (0: all), then of the words in
  `also` found later in the file, in the file's order; whether any of the file's words has an
  upper-case letter). A damaged file is a one-line error."""
  reader = _Reader(path)
  records = reader.records()
  dim = next(records)
  if dim <= 0:
    reader.fail("line 1", "the vectors have no values")
  vectors, seen, repeated = {}, set(), dict[str, int]()
  for number, (where, word, values) in enumerate(records, start=1):
    vector = reader.vector(values, f"{where} ({word!r})")  # every record checked, kept or not
    if word in seen:
      repeated[word] = repeated.get(word, 1) + 1
      continue
    seen.add(word)
    if not max_words or number <= max_words or word in also:
      vectors[word] = vector
  if not vectors:
    reader.fail("line 2", "the file holds no vectors")
  if repeated:
    # Kept and said, as gensim does: published files have a few (GloVe's Common Crawl vectors).
    first, times = next(iter(repeated.items()))
    logging.warning(
      "word vectors %s: %d word(s) listed more than once, the first vector of each kept (first: %r, %d times)",
      path,
      len(repeated),
      first,
      times,
    )
  return vectors, reader.cased


def words_of(texts, lowercase: bool) -> set:
  """The words of `texts` as the word-level tokenizer splits them."""
  split = pre_tokenizers.BertPreTokenizer()
  words: set[str] = set()
  for text in texts:
    if text:
      words.update(w for w, _ in split.pre_tokenize_str(text.lower() if lowercase else text))
  return words


def word_tokenizer(words: list, lowercase: bool) -> PreTrainedTokenizerFast:
  """A fast word-level tokenizer: `[PAD]` 0, `[UNK]` 1, `[MASK]` 2, then `words` in order."""
  vocab = {token: i for i, token in enumerate(SPECIALS)}
  for word in words:
    vocab.setdefault(word, len(vocab))
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
  if lowercase:
    tokenizer.normalizer = normalizers.Lowercase()
  tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tokenizer.add_special_tokens(list(SPECIALS))  # "[MASK]" in a text is one token, not "[", "MASK", "]"
  return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, unk_token=UNK, mask_token=MASK)


def embedding_matrix(tokenizer, vectors: dict, dim: int, seed: int) -> np.ndarray:
  """[vocab, dim]: each word's vector; words without one and `[UNK]`/`[MASK]` uniform in
  [-0.25, 0.25]; `[PAD]` zeros."""
  rng = np.random.default_rng(seed)
  vocab = tokenizer.get_vocab()
  matrix = rng.uniform(-_RANDOM_SCALE, _RANDOM_SCALE, (len(vocab), dim)).astype(np.float32)
  for word, i in vocab.items():
    if word in vectors:
      matrix[i] = vectors[word]
  matrix[vocab[PAD]] = 0
  return matrix


def vocabulary(path: str, max_words: int, training_texts) -> tuple:
  """(tokenizer, {word: vector}, dim) of a vectors file and the training sets' texts: the file's
  first `max_words` words, then the training words the file lacks."""
  texts = list(training_texts)
  as_written, lower = words_of(texts, lowercase=False), words_of(texts, lowercase=True)
  # One pass over the file keeps the training words in either case: whether the file is lower-cased
  # is known once it is read.
  vectors, cased = read_word_vectors(path, max_words, as_written | lower)
  training = as_written if cased else lower
  head = list(vectors)[:max_words] if max_words else list(vectors)
  kept = set(head) | training
  vectors = {w: v for w, v in vectors.items() if w in kept}
  words = list(vectors) + sorted(training - vectors.keys())
  return word_tokenizer(words, lowercase=not cased), vectors, len(next(iter(vectors.values())))
