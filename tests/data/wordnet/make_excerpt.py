"""Writes `minilm_jax/data/wordnet/data.noun`: the excerpt of WordNet 3.0's noun database that ships
with the package (`minilm_jax.data.wordnet_db.EXCERPT_DIR`), which the tests and the demo's evaluators
read, so neither needs `apt-get install wordnet-base`. Run it where the full database is installed:

    python tests/data/wordnet/make_excerpt.py /usr/share/wordnet

With `--small`, from that excerpt, it writes `tests/data/wordnet_small/data.noun`, cut by the same
rules (60 training and 30 dev synsets of each lexicographer file, 160 and 80 pairs): a sixth of each
task's examples, which the tests that run the WordNet tasks through a program (training,
distilling, evaluating) read; the tests of the tasks themselves read the full one:

    python tests/data/wordnet/make_excerpt.py minilm_jax/data/wordnet --small

It keeps the license header and, of every synset it keeps, the fields `minilm_jax.data.wordnet_db`
reads (offset, lexicographer file, words, gloss); pointers are dropped (a pointer count of 000), so
the offsets are WordNet's synset ids, not byte positions in this file. It keeps enough synsets for
both WordNet tasks' full splits (2,000 training and 1,000 dev examples each):

- `wordnet_supersense`: 400 training and 200 dev synsets of each of its five lexicographer files;
- `wordnet_examples`: the senses with example sentences of words picked in a fixed hash order,
  until each split has its examples with a negative.
"""

import os
import sys
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from minilm_jax.data import wordnet_db  # noqa: E402
from minilm_jax.tasks import wordnet  # noqa: E402

PER_LEXFILE = {"train": 400, "dev": 200}
PAIRS_WANTED = {"train": 1100, "dev": 550}  # synsets with a negative; each gives two examples
SMALL = {"per_lexfile": {"train": 60, "dev": 30}, "pairs_wanted": {"train": 160, "dev": 80}}
SMALL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wordnet_small")


def _order(key: str) -> int:
  return zlib.crc32(f"excerpt/{key}".encode())


def _pairs(synsets: list) -> int:
  """How many of `synsets` have another sense (with examples) of one of their words: the task's rule."""
  senses = {}
  for s in synsets:
    for w in s.words:
      senses.setdefault(w.lower(), set()).add(s.offset)
  return sum(any(len(senses[w.lower()]) > 1 for w in s.words) for s in synsets)


def select(synsets: list, per_lexfile=PER_LEXFILE, pairs_wanted=PAIRS_WANTED) -> set:
  keep = set()
  by_split = {"train": [], "dev": []}
  for s in synsets:
    by_split[wordnet_db.split_of(s.offset)].append(s)
  for split, rows in by_split.items():
    for lexfile in wordnet._LEXNAMES:
      chosen = sorted((s for s in rows if s.lexfile == lexfile), key=lambda s: _order(s.offset))
      keep.update(s.offset for s in chosen[: per_lexfile[split]])
    with_examples = [s for s in rows if s.examples]
    senses = {}
    for s in with_examples:
      for w in s.words:
        senses.setdefault(w.lower(), []).append(s)
    picked = []
    for word in sorted(senses, key=_order):
      if len(senses[word]) > 1:
        picked.extend(s for s in senses[word] if s.offset not in {p.offset for p in picked})
        if _pairs(picked) >= pairs_wanted[split]:
          break
    keep.update(s.offset for s in picked)
  return keep


def main(source: str, small: bool = False):
  keep = select(wordnet_db.read_synsets(source), **(SMALL if small else {}))
  out_dir = SMALL_DIR if small else wordnet_db.EXCERPT_DIR
  os.makedirs(out_dir, exist_ok=True)
  with (
    open(os.path.join(source, "data.noun"), encoding="utf-8") as f,
    open(os.path.join(out_dir, "data.noun"), "w", encoding="utf-8") as out,
  ):
    for line in f:
      if line.startswith("  "):
        out.write(line)
        continue
      head, _, gloss = line.partition(" | ")
      fields = head.split()
      if fields[0] not in keep:
        continue
      count = int(fields[3], 16)
      out.write(" ".join(fields[: 4 + 2 * count] + ["000"]) + " | " + gloss)


if __name__ == "__main__":
  args = [a for a in sys.argv[1:] if a != "--small"]
  main(args[0] if args else wordnet_db.WORDNET_DIR, small="--small" in sys.argv[1:])
