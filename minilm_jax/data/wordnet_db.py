"""WordNet 3.0's database files (wndb(5)), which Debian ships as `wordnet-base` (`apt-get install
wordnet-base`: /usr/share/wordnet), and the excerpt of its noun file that ships with the package:
the synsets and the fixed split of a synset (by a hash of its offset) that every WordNet task,
evaluator and the built-in `wordnet` corpus share (no synset is in two splits).
"""

import dataclasses
import os
import re
import zlib

from minilm_jax.errors import UserError

WORDNET_DIR = "/usr/share/wordnet"
# The excerpt that ships with the package (tests/data/wordnet/make_excerpt.py): every synset both
# tasks' splits need, for runs on machines without `wordnet-base` (the tests, the demo).
EXCERPT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wordnet")


@dataclasses.dataclass(frozen=True)
class Synset:
  offset: str
  lexfile: int
  words: tuple
  definition: str
  examples: tuple


def read_synsets(data_dir: str, pos: str = "noun") -> list:
  """Every synset of `data.<pos>`: the line format of WordNet's wndb(5) man page."""
  path = os.path.join(data_dir or WORDNET_DIR, f"data.{pos}")
  if not os.path.isfile(path):
    raise UserError(
      f"WordNet's {path} does not exist: `apt-get install wordnet-base`, or set data_dir to a WordNet 3.0 dict folder"
    )
  synsets = []
  fix = "give WordNet 3.0's own file (`apt-get install wordnet-base`, or a dict folder as data_dir)"
  try:
    with open(path, encoding="utf-8") as f:
      for line_number, line in enumerate(f, start=1):  # noqa: B007 (the error below names it)
        if line.startswith("  ") or not line.strip():  # the license header; a blank line
          continue
        synsets.append(_synset(line))
  except UnicodeDecodeError as e:
    raise UserError(f"{path} is not UTF-8 text (byte {e.start}): {fix}") from None
  except (ValueError, IndexError):
    raise UserError(f"{path}:{line_number}: not a synset line of wndb(5) ({line.strip()[:60]!r}): {fix}") from None
  if not synsets:
    raise UserError(f"{path} holds no synsets: {fix}")
  return synsets


def _synset(line: str) -> Synset:
  """One line of data.<pos>: offset, lexicographer file, type, word count (hex), words, ... | gloss."""
  head, _, gloss = line.partition(" | ")
  fields = head.split()
  count = int(fields[3], 16)
  words = tuple(w.replace("_", " ") for w in fields[4 : 4 + 2 * count : 2])
  if not fields[0].isdigit() or len(words) != count or not count:
    raise ValueError(line)
  definition = re.split(r';?\s*"', gloss, maxsplit=1)[0].strip().rstrip(";").strip()
  examples = tuple(e.strip() for e in re.findall(r'"([^"]+)"', gloss) if len(e.split()) >= 3)
  return Synset(fields[0], int(fields[1]), words, definition, examples)


def split_of(offset: str) -> str:
  return "dev" if zlib.crc32(offset.encode()) % 5 == 0 else "train"
