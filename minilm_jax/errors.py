"""User-facing errors: one line that names the problem and what to do."""

import errno
import re


class UserError(Exception):
  """Bad input from the user (path, config field, data). Programs print it as one line."""


class StorageError(UserError):
  """Storage that filled up or refused a write while a program saved (a one-line UserError);
  `reason` is the OS's words, for a program that says in its own words what it was writing."""

  def __init__(self, message: str, reason: str):
    super().__init__(message)
    self.reason = reason


class Preempted(Exception):
  """A run stopped by SIGTERM after saving its checkpoint. Programs exit with PREEMPTED_EXIT_CODE,
  so that a scheduler can tell a preempted run (rerun it to resume) from a finished one."""


# Storage that is full or not writable: the machine's state, not a bug, so one line too.
# Errors of storage (full, over quota, read-only, not writable), not of the program.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a process ended by the signal

# numpy's writers (np.save to an open file, ndarray.tofile) report a write the disk cut short as a
# bare OSError("6400 requested and 2016 written"), without an errno.
_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")


def storage_failure(error: OSError) -> str | None:
  """What a storage error says, for one line: full, over quota, read-only or not writable storage,
  or a write the disk cut short; None for any other OSError (a bug, or the program's own to report)."""
  if error.errno in STORAGE_ERRNOS:
    return error.strerror or str(error)
  short = _SHORT_WRITE.search(str(error)) if error.errno is None else None
  if short:
    return f"a write was cut short ({short.group(2)} of {short.group(1)} bytes written: is the disk full?)"
  return None
