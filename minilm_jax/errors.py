"""User-facing errors: one line that names the problem and what to do."""

import errno


class UserError(Exception):
  """Bad input from the user (path, config field, data). Programs print it as one line."""


class Preempted(Exception):
  """A run stopped by SIGTERM after saving its checkpoint. Programs exit with PREEMPTED_EXIT_CODE,
  so that a scheduler can tell a preempted run (rerun it to resume) from a finished one."""


# Storage that is full or not writable: the machine's state, not a bug, so one line too.
# Errors of storage (full, over quota, read-only, not writable), not of the program.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a process ended by the signal
