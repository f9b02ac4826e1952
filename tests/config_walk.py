"""How far a run's config travels: the package's functions that receive it (or a part of it) as an
argument while a program runs, and the modules they sit in.

  python tests/config_walk.py minilm_jax.train --config configs/demo.py --workdir W --config.num_steps=1
  python tests/config_walk.py minilm_jax.finetune --config configs/finetune/glue.py --workdir W ...

runs the program in this process with a profiler that records every call into `minilm_jax` that is
passed an `ml_collections.ConfigDict` (the program's config and its blocks, `config.loss`,
`config.optimizer`, ... are the only ones a program holds): each such function is one stop. It
prints the stops in the order first reached, then their count and the count of their modules.
"""

import collections
import os
import runpy
import sys
import threading

import ml_collections

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "minilm_jax") + os.sep


def walk(module: str, argv: list) -> dict:
  """{(module file, function): calls} of the functions in the package that received a ConfigDict
  while `python -m <module> <argv>` ran here, in the order first reached."""

  def run():
    sys.argv = [module, *argv]
    try:
      runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
      if e.code not in (0, None):
        raise

  return walk_call(run)


def walk_call(fn, *args) -> dict:
  """The same stops while `fn(*args)` runs here (a program's builder, say: `build_finetuning(config,
  workdir)`, whose walk the suite holds to a budget)."""
  stops: dict = collections.OrderedDict()

  def profile(frame, event, arg):
    if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
      return
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if any(isinstance(frame.f_locals.get(name), ml_collections.ConfigDict) for name in names):
      where = (os.path.relpath(code.co_filename, os.path.dirname(PACKAGE)), code.co_qualname)
      stops[where] = stops.get(where, 0) + 1

  threading.setprofile(profile)
  sys.setprofile(profile)
  try:
    fn(*args)
  finally:
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
  return stops


def summary(stops: dict) -> tuple:
  """(stops, modules) of a walk."""
  return len(stops), len({path for path, _ in stops})


def main():
  stops = walk(sys.argv[1], sys.argv[2:])
  for (path, function), calls in stops.items():
    print(f"{path}: {function} ({calls} call{'s' if calls > 1 else ''})")
  print("{} stops in {} modules".format(*summary(stops)))


if __name__ == "__main__":
  main()
