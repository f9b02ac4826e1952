"""Program start-up, shared by every `python -m minilm_jax.<program>`: flags and config overrides,
logging, multi-process initialisation, and the mapping of failures to exit codes (bad input: one
line on stderr and exit 2; full or read-only storage: one line and exit 2; preemption: 143).

Each program defines its flags on its own `Program.flag_values`, not on absl's global `FLAGS`: the
programs share flag names (`--config`, `--workdir`, `--out`), so only then can one process (a
test) import them all and call each one's `main` through `run_program` as its command line does.
"""

import dataclasses
import errno
import os
import sys

from absl import app, flags, logging

import minilm_jax
from minilm_jax.devices.distributed import maybe_initialize
from minilm_jax.errors import PREEMPTED_EXIT_CODE, Preempted, UserError, storage_failure
from minilm_jax.runs import lock
from minilm_jax.runs.checkpoints import quiet_orbax_failure_reports


def check_environment():
  """One line for an environment variable JAX reads that would fail deep in its start-up (a GPU
  plugin's traceback, then a misleading error): the memory share JAX preallocates on a GPU."""
  if not minilm_jax.memory_fraction_readable():
    raise UserError(
      f"XLA_PYTHON_CLIENT_MEM_FRACTION={os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION']!r} is not a share of the "
      f"GPU's memory: give a number in (0, 1], e.g. 0.75 (JAX's default), or unset it"
    )


@dataclasses.dataclass(frozen=True)
class Program:
  """One program's command line: the flags its module defines (`flag_values=PROGRAM.flag_values`)
  and what a full or read-only disk leaves in place, for its one-line error."""

  flag_values: flags.FlagValues = dataclasses.field(default_factory=flags.FlagValues)
  kept_on_storage_error: str = "the checkpoints already saved are kept"


def with_absl_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
  """The program's registry with absl's own flags (`--verbosity`, `--logtostderr`) and those
  libraries define (Orbax's) taken in from the global FLAGS, so that one parse sets them too."""
  for name in list(flags.FLAGS):
    if name not in flag_values and flags.FLAGS[name].name == name:
      flag_values[name] = flags.FLAGS[name]
  return flag_values


def _parse_flags(flag_values: flags.FlagValues) -> list:
  """The command line's flags and config overrides parsed, or one line on stderr and exit 2 for
  an unknown override, a malformed flag or a --config file that cannot be loaded."""
  with_absl_flags(flag_values)
  try:
    argv = flag_values(sys.argv)
  except (KeyError, AttributeError) as e:
    # ml_collections reports an unknown --config.<field> override as a KeyError/AttributeError.
    # Its message is "'field'" or "'field'\nDid you mean \"other\" instead of \"field\"?", nested in quotes.
    lines = str(e.args[0] if e.args else e).replace("\\n", "\n").splitlines()
    field = lines[0].strip("'\"\\ ")
    hint = next(
      (f" ({line.strip(chr(39) + ' ')})".replace('\\"', '"') for line in lines[1:] if "Did you mean" in line), ""
    )
    print(
      f"error: unknown config field {field!r} on the command line{hint}: check its spelling against the config file",
      file=sys.stderr,
    )
    sys.exit(2)
  except (flags.Error, ValueError) as e:
    print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
    sys.exit(2)
  except Exception as e:  # raised while executing the --config file (a syntax error, a bad import, ...)
    where = f" ({e.filename}, line {e.lineno})" if isinstance(e, SyntaxError) else ""
    print(
      f"error: the --config file could not be loaded{where}: {type(e).__name__}: "
      f"{' '.join(str(getattr(e, 'msg', e)).split())[:200]}",
      file=sys.stderr,
    )
    sys.exit(2)

  flags.FLAGS.mark_as_parsed()  # its flags' values were set through the program's registry
  if "config" in flag_values and flag_values["config"].present:
    try:  # ml_collections reports a file it could not find on first access to the config
      flag_values.config.keys()
    except OSError:
      print(
        f"error: the --config file {getattr(flag_values['config'], 'config_filename', '')} does not exist: "
        f"check the path",
        file=sys.stderr,
      )
      sys.exit(2)
  return argv


def run_program(main, program: Program):
  """Runs an absl program on `sys.argv`: flag and config-override errors and UserErrors become one
  line on stderr and exit code 2; so does full or read-only storage, saying what the failure left
  in place."""
  if any(arg in ("-h", "--help", "-help", "--helpfull") for arg in sys.argv[1:]):
    print(program.flag_values.main_module_help() or program.flag_values.get_help())
    sys.exit(0)
  argv = _parse_flags(program.flag_values)

  def main_or_one_line(argv):
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)  # Orbax and datasets log every step at INFO
    quiet_orbax_failure_reports()
    try:
      check_environment()
      maybe_initialize()  # before any device is touched
      minilm_jax.end_of_imports()
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except OSError as e:
      if e.errno == errno.ENAMETOOLONG:  # a --workdir or --out of a name over the file system's 255 bytes
        name = f" {e.filename}" if e.filename else ""
        print(f"error: the path{name} has a name longer than the file system allows: shorten it", file=sys.stderr)
        sys.exit(2)
      failure = storage_failure(e)
      if failure is None:
        raise
      where = f" writing {e.filename}" if e.filename else ""
      print(
        f"error: {failure}{where}: free space there (or make it writable) and rerun the same command; "
        f"{program.kept_on_storage_error}",
        file=sys.stderr,
      )
      sys.exit(2)
    except Preempted as e:
      print(f"preempted: {e}", file=sys.stderr)
      sys.exit(PREEMPTED_EXIT_CODE)

  try:
    app.run(main_or_one_line, argv=argv, flags_parser=lambda parsed: parsed)
  finally:
    lock.release_all()  # before the interpreter's exit handlers: a held workdir is free when the program ends
