"""Jitted programs built once per process and reused by each of its runs that would build the same.

`jax.jit` caches its traces and executables per function object, and each run builds its functions
afresh (they close over its model, task and config), so a second run of one shape in a process
(a bench's next seed or learning rate, a grid's next setting) traced, lowered and compiled again:
most of a small run's time. A builder asks `reused(key, build)` instead; runs of equal keys get the
first one's functions, whose jit caches then hold their shapes already.

A key holds every value the built functions close over and do not take as an argument. Values that
are arguments (parameters, batches, random keys, the learning-rate schedule: `train_state.Schedule`)
stay out of it, and so may differ between the runs that share a program."""

import collections
import json
from collections.abc import Callable, Hashable, Iterable
from typing import Any

# The programs of the latest keys: a bench's rows (a teacher and a few students' shapes, a few
# tasks) fit; older ones are let go with their executables.
_KEPT = 16
_built: collections.OrderedDict = collections.OrderedDict()


def reused(key: Hashable, build: Callable[[], Any]) -> Any:
  """`build()`, or what it returned for an equal `key` earlier in this process."""
  if key in _built:
    _built.move_to_end(key)
    return _built[key]
  value = _built[key] = build()
  if len(_built) > _KEPT:
    _built.popitem(last=False)
  return value


def config_key(config, arguments: Iterable[str]) -> str:
  """`config` (an ml_collections ConfigDict) as canonical JSON, without the fields named in
  `arguments` (dotted: "optimizer.lr", or a whole block: "checkpoint"): those that reach a program
  as its arguments, or not at all. Every other field stays in: a field nobody listed costs a
  program's reuse, never its correctness."""
  values = json.loads(config.to_json())
  for name in arguments:
    *parents, field = name.split(".")
    block = values
    for parent in parents:
      block = block.get(parent, {})
    block.pop(field, None)
  return json.dumps(values, sort_keys=True)
