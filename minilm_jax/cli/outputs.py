"""Writing a program's result directory (an export, a prepared corpus, evaluation results): never
over an existing result unless the user said so, never over anything we did not write, never over
or into what the program reads, and never half. The files are written into a hidden directory
beside the destination, which takes the destination's name only once everything is written (with
`MARKER` in it, last), so a full disk, a kill or a bad input midway leaves the destination exactly
as it was; `--overwrite` replaces only a directory that holds `MARKER`."""

import contextlib
import errno
import json
import os
import shutil
import tempfile

from minilm_jax import __version__
from minilm_jax.data.files import written_whole
from minilm_jax.errors import UserError

# Written last into every result directory these programs finish: what `--overwrite` may replace.
MARKER = ".minilm_jax_output"


def _check_apart(path: str, flag: str, inputs):
  """Refuses a destination that is, lies inside or contains one of `inputs` ((what, path) pairs:
  the runs, models and files the program reads), links resolved: replacing it would delete what
  the program reads, and writing inside it would change a run or model behind its back."""
  out = os.path.realpath(path)
  for what, given in inputs:
    if not os.path.exists(given):  # a hub name, a corpus name: nothing on this disk to protect
      continue
    source = os.path.realpath(given)
    if out == source or out.startswith(source + os.sep):
      raise UserError(f"{flag} {path} is {what} {given} or lies inside it: write the output outside what it reads")
    if source.startswith(out + os.sep):
      raise UserError(f"{flag} {path} contains {what} {given}: write the output where nothing it reads lies")


def check_new_directory(path: str, flag: str, overwrite: bool, inputs=(), overwritable: bool = True):
  """Refuses, in one line, a destination that is a file; that is, lies inside or contains one of
  `inputs` ((what, path) pairs); that holds files without `overwrite` (the message offers
  --overwrite where the program has it: `overwritable`); or, with `overwrite`, that holds files
  without `MARKER` (not an earlier output of ours). Called before any work, so that the refusal
  costs nothing."""
  if os.path.isfile(path):
    raise UserError(f"{flag} {path} is a file: name a directory to write into")
  _check_name_lengths(path, flag)
  _check_apart(path, flag, inputs)
  entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
  shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
  if entries and not overwrite:
    hint = ", or add --overwrite to replace them" if overwritable else ""
    raise UserError(f"{flag} {path} already holds {len(entries)} files ({shown}): choose a new {flag}{hint}")
  if entries and MARKER not in entries:
    raise UserError(
      f"{flag} {path} holds {len(entries)} files ({shown}) that are not an earlier output of minilm_jax "
      f"(no {MARKER}): --overwrite replaces only those; choose a new {flag}, or remove it yourself"
    )


def check_writable(path: str, flag: str):
  """One line, before any work, when the folder `path` (or the nearest folder above it that exists,
  where it would be made) takes no new file: a read-only mount, a folder of another user's."""
  folder = os.path.abspath(path)
  while not os.path.isdir(folder):
    folder = os.path.dirname(folder)
  try:
    tempfile.TemporaryFile(dir=folder).close()
  except OSError as e:
    raise UserError(
      f"{flag} {path}: {folder} takes no new file ({e.strerror or e}): give a folder this program can write"
    ) from None


def check_new_file(path: str, flag: str):
  """Refuses, in one line and before any work, a results file that exists (results are kept, never
  replaced by a later run) or that could not be written where it is named: its folder missing, or a
  file."""
  if os.path.exists(path):
    raise UserError(f"{flag} {path} already exists: name a new file (earlier results are never replaced)")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder):
    what = "is a file" if os.path.exists(folder) else "does not exist"
    raise UserError(f"{flag} {path}: its folder {folder} {what}: name a file in an existing folder")


def write_json(path: str, value):
  """`value` as indented JSON at `path`, written to a temporary name then renamed: an interrupted
  write leaves the earlier file (or none), never half of one."""
  with written_whole(path) as pending, open(pending, "w") as f:
    f.write(json.dumps(value, indent=2) + "\n")


def _staging_prefix(path: str) -> str:
  return f".{os.path.basename(path)}.partial-"


# What `new_directory` adds to the destination's name for the hidden folder it writes into: the
# prefix's dot and ".partial-", a process id and mkdtemp's 8 characters.
_STAGING_EXTRA_BYTES = len(_staging_prefix("")) + 7 + 1 + 8


def _check_name_lengths(path: str, flag: str):
  """One line for a destination with a name the file system would refuse (over its name limit,
  255 bytes on most, less what the hidden folder it is written in adds to the last name)."""
  absolute = os.path.abspath(path)
  existing = absolute
  while not os.path.isdir(existing):
    existing = os.path.dirname(existing)
  limit = os.pathconf(existing, "PC_NAME_MAX")
  *folders, last = absolute.split(os.sep)
  if any(len(os.fsencode(name)) > limit for name in folders) or len(os.fsencode(last)) + _STAGING_EXTRA_BYTES > limit:
    raise UserError(
      f"{flag} {path}: a name in it is longer than this file system allows ({limit} bytes a name, "
      f"{limit - _STAGING_EXTRA_BYTES} for the last, which is written under a longer hidden name first): shorten it"
    )


def _remove_stale_staging(path: str):
  """Removes what writers of `path` killed before they finished left beside it (their hidden
  staging directories, named with their process id): those of processes no longer running."""
  prefix = _staging_prefix(path)
  for entry in os.listdir(os.path.dirname(path)):
    pid = entry[len(prefix) :].split("-", 1)[0] if entry.startswith(prefix) else ""
    if not pid.isdigit():
      continue
    try:
      os.kill(int(pid), 0)
    except ProcessLookupError:
      shutil.rmtree(os.path.join(os.path.dirname(path), entry), ignore_errors=True)
    except PermissionError:  # another user's process, running
      pass


@contextlib.contextmanager
def new_directory(path: str, flag: str, overwrite: bool, inputs=(), overwritable: bool = True):
  """Yields a hidden directory beside `path` to write into; when the block ends without an
  error it gets `MARKER` and becomes `path` (an earlier `path`, allowed by `overwrite`, is removed
  only then). On an error it is removed and `path` is untouched. `inputs`: as `check_new_directory`."""
  check_new_directory(path, flag, overwrite, inputs, overwritable)
  path = os.path.abspath(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  _remove_stale_staging(path)
  staging = tempfile.mkdtemp(prefix=f"{_staging_prefix(path)}{os.getpid()}-", dir=os.path.dirname(path))
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(staging, 0o777 & ~umask)  # mkdtemp's is private; the result gets what a mkdir would give
  try:
    yield staging
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    raise
  write_json(os.path.join(staging, MARKER), {"written_by": "minilm_jax", "version": __version__})
  if overwrite and os.path.isdir(path):
    earlier = staging + ".replaced"
    os.rename(path, earlier)
    os.rename(staging, path)
    shutil.rmtree(earlier, ignore_errors=True)
    return
  try:  # renaming onto a directory that is not empty fails: what another program wrote meanwhile stays
    os.rename(staging, path)
  except OSError as e:
    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
      raise
    shutil.rmtree(staging, ignore_errors=True)
    raise UserError(
      f"{flag} {path} was written by another program while this one was writing it: it is kept as that "
      f"program wrote it, and this one wrote nothing; rerun with another {flag}"
    ) from None
