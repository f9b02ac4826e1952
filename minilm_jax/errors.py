"""User-facing errors: one line that names the problem and what to do."""

import sys


class UserError(Exception):
  """Bad input from the user (path, config field, data). Programs print it as one line."""


def run_main(main, argv=None):
  """Runs a program's `main`, turning a UserError into one line on stderr and exit code 2."""
  try:
    return main(argv)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
