"""Writing a program's result directory (an export, a prepared corpus): never over an existing
result unless the user said so, and never half. The files are written into a hidden directory
beside the destination, which takes the destination's name only once everything is written, so
a full disk, a kill or a bad input midway leaves the destination exactly as it was."""

import contextlib
import json
import os
import shutil
import tempfile

from minilm_jax.errors import UserError


def check_new_directory(path: str, flag: str, overwrite: bool):
  """Refuses, in one line, a destination that is a file, or a directory holding files without
  `overwrite`. Called before any work, so that the refusal costs nothing."""
  if os.path.isfile(path):
    raise UserError(f"{flag} {path} is a file: name a directory to write into")
  entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
  if entries and not overwrite:
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    raise UserError(
      f"{flag} {path} already holds {len(entries)} files ({shown}): choose a new {flag}, "
      f"or add --overwrite to replace them"
    )


def write_json(path: str, value):
  """`value` as indented JSON at `path`, written to a temporary name then renamed: an interrupted
  write leaves the earlier file (or none), never half of one."""
  with open(path + ".tmp", "w") as f:
    f.write(json.dumps(value, indent=2) + "\n")
  os.replace(path + ".tmp", path)


@contextlib.contextmanager
def new_directory(path: str, flag: str, overwrite: bool):
  """Yields a hidden directory beside `path` to write into; when the block ends without an
  error it becomes `path` (an earlier `path`, allowed by `overwrite`, is removed only then). On an
  error it is removed and `path` is untouched."""
  check_new_directory(path, flag, overwrite)
  path = os.path.abspath(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.partial-", dir=os.path.dirname(path))
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private; the result gets what a mkdir would give
  try:
    yield staging
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  if os.path.isdir(path):
    earlier = staging + ".replaced"
    os.rename(path, earlier)
    os.rename(staging, path)
    shutil.rmtree(earlier, ignore_errors=True)
  else:
    os.rename(staging, path)
