"""Sentence sentiment from the VADER paper's human ratings (Hutto & Gilbert, ICWSM 2014), which ship
on PyPI inside vaderSentiment's source package (MIT licence), so they need no download beyond pip:

  pip download vaderSentiment==3.3.2 --no-deps --no-binary :all: -d DIR
  ... --config.data_dir=DIR/vaderSentiment-3.3.2.tar.gz

Four sources of English text, each sentence rated from -4 to +4 by 20 people (the file holds the
mean): `vader_movies` (10,605 Rotten Tomatoes snippets, Pang & Lee's sentence polarity set),
`vader_tweets` (4,200 tweets), `vader_amazon` (3,708 sentences of product reviews) and `vader_nyt`
(5,190 sentences of New York Times editorials). The task: is the sentence negative or positive?
Sentences whose raters' mean lies within 0.5 of neutral are left out (their label is the raters'
disagreement, not the sentence's sentiment). `vader_movies_rating` is a regression on the same
snippets: every sentence, neutral ones included, scored by its raters' mean (-4 to +4), measured by
Pearson's and Spearman's correlations.

Splits are fixed by a hash of the document (a review's or an editorial's sentences stay together)
and sized as the WordNet tasks, for the thesis's small-data setting: up to 2,000 training and 1,000
dev sentences.

`data_dir` is the source package (`vaderSentiment-3.3.2.tar.gz`), the `hutto_ICWSM_2014.tar.gz`
inside it, or a folder holding the `*_GroundTruth.txt` files.
"""

import dataclasses
import io
import os
import tarfile
import zlib

import datasets

from minilm_jax.errors import UserError
from minilm_jax.tasks.glue import ClassificationTask, example_columns, fixed_subset

_SOURCES = {
  "vader_movies": "movieReviewSnippets",
  "vader_tweets": "tweets",
  "vader_amazon": "amazonReviewSnippets",
  "vader_nyt": "nytEditorialSnippets",
}
_SIZES = {"train": 2000, "dev": 1000}
NEUTRAL_BAND = 0.5  # |mean rating| below this: left out
_HOW = (
  "`pip download vaderSentiment==3.3.2 --no-deps --no-binary :all: -d DIR` and set data_dir to "
  "DIR/vaderSentiment-3.3.2.tar.gz"
)


def read_ground_truth(data_dir: str, source: str) -> bytes:
  """The bytes of `<source>_GroundTruth.txt` from the source package, the inner archive or a folder."""
  name = f"{source}_GroundTruth.txt"
  if not data_dir:
    raise UserError(f"the VADER tasks read vaderSentiment's source package: {_HOW}")
  if os.path.isdir(data_dir):
    for folder in (data_dir, os.path.join(data_dir, "hutto_ICWSM_2014")):
      if os.path.isfile(os.path.join(folder, name)):
        with open(os.path.join(folder, name), "rb") as f:
          return f.read()
    raise UserError(f"{data_dir} holds no {name}: {_HOW}")
  if not os.path.isfile(data_dir):
    raise UserError(f"data_dir {data_dir} does not exist: {_HOW}")
  try:
    with tarfile.open(data_dir) as outer:
      return _member(outer, name, data_dir)
  except (tarfile.TarError, OSError, EOFError) as e:
    raise UserError(f"{data_dir} is not a readable .tar.gz ({e}): {_HOW}") from None


def _member(archive: tarfile.TarFile, name: str, path: str) -> bytes:
  """`name` from the archive, or from the archive of the paper's data nested in it (the sdist's)."""
  for member in archive.getmembers():
    if member.isfile() and os.path.basename(member.name) in (name, "hutto_ICWSM_2014.tar.gz"):
      extracted = archive.extractfile(member)
      assert extracted is not None  # a regular file's member always extracts
      data = extracted.read()
      if os.path.basename(member.name) == name:
        return data
      with tarfile.open(fileobj=io.BytesIO(data)) as inner:
        return _member(inner, name, path)
  raise UserError(f"{path} holds no {name}: {_HOW}")


def split_of(document: str) -> str:
  return "dev" if zlib.crc32(document.encode()) % 5 == 0 else "train"


@dataclasses.dataclass(frozen=True)
class VaderTask(ClassificationTask):
  source: str = ""  # the ratings' file, `<source>_GroundTruth.txt`

  def load(self, split: str, data_dir: str = "", language: str = "") -> datasets.Dataset:
    if split not in _SIZES:
      raise UserError(f"{self.name} has the splits {sorted(_SIZES)}, not {split!r}")
    source, regression = self.source, self.labels is None
    raw = read_ground_truth(data_dir, source)
    try:
      lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
      raise UserError(f"{source}_GroundTruth.txt in {data_dir} is not UTF-8 (byte {e.start}): {_HOW}") from None
    rows = example_columns()
    for number, line in enumerate(lines, start=1):
      if not line.strip():
        continue
      try:
        sentence_id, rating, text = line.split("\t")
        score = float(rating)
      except ValueError:
        raise UserError(
          f"{source}_GroundTruth.txt:{number} in {data_dir} is not 'id<TAB>mean rating<TAB>sentence' "
          f"({line[:60]!r}): {_HOW}"
        ) from None
      if (abs(score) < NEUTRAL_BAND and not regression) or split_of(sentence_id.split("_")[0]) != split:
        continue
      rows["text_a"].append(text)
      rows["text_b"].append(None)
      rows["label"].append(score if regression else int(score > 0))
      rows["idx"].append(number)
      rows["group"].append("")
    if not rows["label"]:
      raise UserError(f"{source}_GroundTruth.txt in {data_dir} has no rated sentences in {split}: {_HOW}")
    return fixed_subset(rows, split, _SIZES[split])


_CLASSIFICATION = {
  name: VaderTask(name, ("sentence",), "", ("negative", "positive"), ("accuracy", "f1"), ("", ""), (), source=source)
  for name, source in _SOURCES.items()
}
_REGRESSION = {
  "vader_movies_rating": VaderTask(
    "vader_movies_rating",
    ("sentence",),
    "",
    None,
    ("pearson", "spearman"),
    ("", ""),
    (),
    source=_SOURCES["vader_movies"],
  )
}
TASKS = {**_CLASSIFICATION, **_REGRESSION}
