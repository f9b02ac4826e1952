"""Real English corpora that need no download, written once as text files (one sentence or text per
line, a blank line between documents), the same on every run:

- "demo": the docstrings of the installed Python standard library, read with `ast` (nothing is
  imported or run), one sentence per line; one source file is one document, so blocks fill up as
  in a book corpus; files in sorted order.
- "wordnet": the unlabelled text of the training split of the WordNet excerpt that ships with the
  package: every training synset's definition and example sentences, each its own document, in the
  excerpt's order. It is the WordNet tasks' and evaluators' kind of text (a task's own unlabelled
  text is the corpus that wins in docs/embeddings.md's "Which student to fine-tune"), and holds nothing of
  the dev split that the demo's evaluators score.
"""

import ast
import contextlib
import hashlib
import inspect
import os
import re
import sys
import sysconfig

from minilm_jax.data import wordnet_db
from minilm_jax.data.files import written_whole

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
# Paragraphs that are mostly prose: code examples, tables and argument lists are left out.
_PROSE = re.compile(r"^[A-Z][^>|=_{}<\[\]\\]*[.!?]$")


def _docstrings(tree):
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node)
      if doc:
        yield doc


def _sentences(doc):
  for paragraph in re.split(r"\n\s*\n", doc):
    text = " ".join(paragraph.split())
    if len(text) >= 40 and _PROSE.match(text):
      yield from (s for s in _SENTENCE_END.split(text) if len(s.split()) >= 4)


def write_demo_corpus(path: str) -> str:
  """Writes the docstring corpus to `path` (once; later calls reuse it) and returns `path`.
  Harvesting it parses every module of the standard library (3 s on 2 cores), and every run
  directory keeps its own copy, so the harvest is kept once per Python under `shared_cache_dir()`
  and copied from there."""
  if os.path.exists(path):
    return path
  stdlib = sysconfig.get_paths()["stdlib"]
  shared = os.path.join(shared_cache_dir(), f"demo_corpus-{_harvest_key(stdlib)}.txt")
  try:
    with open(shared, encoding="utf-8") as f:
      return _write_text(path, f.read())
  except OSError as e:
    if e.filename == path:  # the run's own copy could not be written (a full disk): said by the caller
      raise
  text = _documents_text(_stdlib_documents(stdlib))
  with contextlib.suppress(OSError):  # a cache folder that cannot be written: only the run's copy is
    _write_text(shared, text)
  return _write_text(path, text)


def _harvest_key(stdlib: str) -> str:
  """What the harvest depends on: the Python (its version and standard library) and the code that
  reads it (its source and patterns), so that a version of this package that harvests otherwise
  harvests anew instead of copying an older version's corpus."""
  code = "".join(inspect.getsource(f) for f in (_stdlib_documents, _docstrings, _sentences, _documents_text))
  text = f"{sys.version}\n{stdlib}\n{_SENTENCE_END.pattern}\n{_PROSE.pattern}\n{code}"
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def shared_cache_dir() -> str:
  """Where files that every run on this machine can share are kept: `$MINILM_JAX_CACHE`, else
  `$XDG_CACHE_HOME/minilm_jax` (`~/.cache/minilm_jax`)."""
  if os.environ.get("MINILM_JAX_CACHE"):
    return os.environ["MINILM_JAX_CACHE"]
  return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minilm_jax")


def _stdlib_documents(stdlib: str) -> list:
  documents = []
  for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(d for d in dirs if d not in ("test", "tests", "idle_test", "site-packages", "__pycache__"))
    for name in sorted(f for f in files if f.endswith(".py")):
      try:
        with open(os.path.join(root, name), encoding="utf-8") as f:
          tree = ast.parse(f.read())
      except (SyntaxError, UnicodeDecodeError, ValueError):
        continue
      sentences = [s for doc in _docstrings(tree) for s in _sentences(doc)]
      if sentences:
        documents.append("\n".join(sentences))
  return documents


def write_wordnet_corpus(path: str) -> str:
  """Writes the WordNet excerpt's training text to `path` (once) and returns `path`."""
  if os.path.exists(path):
    return path
  synsets = wordnet_db.read_synsets(wordnet_db.EXCERPT_DIR)
  texts = [t for s in synsets if wordnet_db.split_of(s.offset) == "train" for t in (s.definition, *s.examples)]
  return _write_text(path, _documents_text(texts))


def _documents_text(documents: list) -> str:
  return "\n\n".join(documents) + "\n"


def _write_text(path: str, text: str) -> str:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with written_whole(path) as pending, open(pending, "w", encoding="utf-8") as f:
    f.write(text)
  return path
