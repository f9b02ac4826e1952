"""Files written whole: into a pending name beside their place, renamed into it once complete, so
that an interrupted or failed write (a kill, a full disk) never leaves a half file where a reader,
or a cache, would take it for a whole one. And files and folders identified by their bytes (sha256
digests), wherever they lie."""

import contextlib
import hashlib
import os


@contextlib.contextmanager
def written_whole(path: str):
  """Yields the pending name to write `path`'s content to (in the same folder, with `path`'s
  extension, which numpy's and pyarrow's writers keep; one per process, as several hosts may write
  one cache); renames it to `path` when the block ends. On an error the pending file is removed and
  a storage error names `path` (a write that numpy cut short carries no name of its own)."""
  stem, extension = os.path.splitext(path)
  pending = f"{stem}.{os.getpid()}.partial{extension}"
  try:
    yield pending
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.remove(pending)
    if isinstance(e, OSError) and not e.filename:
      raise OSError(e.errno, e.strerror or str(e), path) from None
    raise
  os.replace(pending, path)


def file_digest(path: str) -> str:
  """The sha256 of a file's bytes: what a run records of an input it reads whole (`RunRecord.inputs`)."""
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def tree_digest(*roots: str) -> str:
  """The sha256 of every file under `roots` (folders walked in name order, each file by its path
  under its root and its bytes; a root that is a file, by its bytes): what a cache of something
  computed from a model folder is keyed by, and what names an input by its content rather than
  its place."""
  digest = hashlib.sha256()
  for root in roots:
    if os.path.isfile(root):
      digest.update(bytes.fromhex(file_digest(root)))
    for folder, dirs, files in os.walk(root):
      dirs.sort()
      for name in sorted(files):
        path = os.path.join(folder, name)
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        digest.update(bytes.fromhex(file_digest(path)))
  return digest.hexdigest()
