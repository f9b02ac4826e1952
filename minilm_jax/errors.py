"""User-facing errors: one line that names the problem and what to do."""

import sys


class UserError(Exception):
  """Bad input from the user (path, config field, data). Programs print it as one line."""


def run_program(main):
  """Runs an absl program: flag and config-override errors and UserErrors become one line on stderr and exit code 2."""
  from absl import app, flags, logging

  try:
    argv = flags.FLAGS(sys.argv)
  except (flags.Error, KeyError, AttributeError, ValueError) as e:
    # ml_collections reports an unknown --config.<field> as KeyError/AttributeError from the parser.
    print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
    sys.exit(2)

  def main_or_one_line(argv):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # Orbax and datasets log every step at INFO
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(main_or_one_line, argv=argv)
