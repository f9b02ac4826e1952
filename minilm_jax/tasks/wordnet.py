"""Two small labelled text tasks read from WordNet 3.0, which Debian ships as `wordnet-base`
(`apt-get install wordnet-base`: the database in /usr/share/wordnet), so they need no download.

- `wordnet_supersense` (one sentence): a noun's dictionary definition -> its lexicographer file
  (supersense), five of them: animal, artifact, food, person, plant. "a member of the genus Canis"
  -> animal. The words being defined are not in the text.
- `wordnet_examples` (sentence pair): a definition and an example sentence -> does the example use
  the word in this sense? The negatives are examples of another sense of the same word ("a sloping
  land beside water" + "he cashed a check at the bank" -> 0), a word-sense task like WiC.

Both are human-written text with human labels. Splits are fixed by a hash of the synset's offset
(no synset is in two splits) and sized for the thesis's small-data setting: 2,000 training and
1,000 dev examples.
"""

import dataclasses
import zlib

import datasets
import numpy as np

from minilm_jax.data.wordnet_db import read_synsets, split_of
from minilm_jax.errors import UserError
from minilm_jax.tasks.glue import ClassificationTask, example_columns, fixed_subset

_LEXNAMES = {5: "animal", 6: "artifact", 13: "food", 18: "person", 20: "plant"}
_SIZES = {"train": 2000, "dev": 1000}


@dataclasses.dataclass(frozen=True)
class SupersenseTask(ClassificationTask):
  def load(self, split: str, data_dir: str = "", language: str = "") -> datasets.Dataset:
    _check_split(self.name, split)
    rows = example_columns()
    for s in read_synsets(data_dir):
      if s.lexfile in _LEXNAMES and split_of(s.offset) == split:
        rows["text_a"].append(s.definition)
        rows["text_b"].append(None)
        rows["label"].append((self.labels or ()).index(_LEXNAMES[s.lexfile]))
        rows["idx"].append(int(s.offset))
        rows["group"].append("")
    return fixed_subset(rows, split, _SIZES[split])


@dataclasses.dataclass(frozen=True)
class ExampleMatchTask(ClassificationTask):
  def load(self, split: str, data_dir: str = "", language: str = "") -> datasets.Dataset:
    _check_split(self.name, split)
    synsets = [s for s in read_synsets(data_dir) if s.examples and split_of(s.offset) == split]
    senses: dict[str, list] = {}
    for s in synsets:
      for w in s.words:
        senses.setdefault(w.lower(), []).append(s)
    rng = np.random.default_rng(zlib.crc32(f"{self.name}/{split}".encode()))
    rows = example_columns()
    for s in synsets:
      others = sorted(
        {o.offset: o for w in s.words for o in senses[w.lower()] if o.offset != s.offset}.values(),
        key=lambda o: o.offset,
      )
      if not others:  # a word with one sense (with examples) makes no negative: leave the synset out
        continue
      other = others[rng.integers(len(others))]
      for label, example in (
        (1, s.examples[rng.integers(len(s.examples))]),
        (0, other.examples[rng.integers(len(other.examples))]),
      ):
        rows["text_a"].append(s.definition)
        rows["text_b"].append(example)
        rows["label"].append(label)
        rows["idx"].append(int(s.offset))
        rows["group"].append("")
    return fixed_subset(rows, split, _SIZES[split])


def _check_split(task: str, split: str):
  if split not in _SIZES:
    raise UserError(f"{task} has the splits {sorted(_SIZES)}, not {split!r}")


TASKS = {
  t.name: t
  for t in (
    SupersenseTask("wordnet_supersense", ("definition",), "", tuple(_LEXNAMES.values()), ("accuracy",), ("", ""), ()),
    ExampleMatchTask("wordnet_examples", ("definition", "example"), "", ("0", "1"), ("accuracy", "f1"), ("", ""), ()),
  )
}
