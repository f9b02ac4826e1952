"""User-facing errors: one line that names the problem and what to do."""

import sys


class UserError(Exception):
  """Bad input from the user (path, config field, data). Programs print it as one line."""


def run_program(main):
  """Runs an absl program: flag and config-override errors and UserErrors become one line on stderr and exit code 2."""
  from absl import app, flags, logging

  try:
    argv = flags.FLAGS(sys.argv)
  except (KeyError, AttributeError) as e:
    # ml_collections reports an unknown --config.<field> override as a KeyError/AttributeError.
    field = str(e.args[0] if e.args else e).strip("'\"")
    print(f"error: unknown config field {field!r} on the command line: check its spelling against the config file",
          file=sys.stderr)
    sys.exit(2)
  except (flags.Error, ValueError) as e:
    print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
    sys.exit(2)

  def main_or_one_line(argv):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # Orbax and datasets log every step at INFO
    try:
      from minilm_jax.distributed import maybe_initialize

      maybe_initialize()  # before any device is touched
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)

  app.run(main_or_one_line, argv=argv)
