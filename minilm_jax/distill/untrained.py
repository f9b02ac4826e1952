"""Which student parameters an objective never trains, found from the traced loss alone.

The MiniLM loss reads only the last layer's queries, keys and values: that layer's attention
output, feed-forward block and LayerNorms, and the pooler, get exactly zero gradient and leave a
run as they were initialised. A run records their names (`meta["untrained"]`) so that an export can
say so. They are found without compiling or running anything: the loss is traced to a jaxpr on
abstract inputs, and a backward liveness pass keeps every input the loss value depends on.
"""

import functools

import jax
import jax.numpy as jnp
from jax.extend import core


def _inner(eqn):
  """The jaxpr an equation calls (jit, remat, custom derivatives), when its inputs and outputs map
  one to one onto the equation's; else None (the equation is then treated as a whole)."""
  for value in eqn.params.values():
    jaxpr = getattr(value, "jaxpr", value)
    if (
      isinstance(jaxpr, core.Jaxpr) and len(jaxpr.invars) == len(eqn.invars) and len(jaxpr.outvars) == len(eqn.outvars)
    ):
      return jaxpr
  return None


def _live_inputs(jaxpr, live_outputs) -> list:
  """For each input of `jaxpr`: does any output in `live_outputs` depend on it?"""
  live = {v for v, used in zip(jaxpr.outvars, live_outputs) if used and isinstance(v, core.Var)}
  for eqn in reversed(jaxpr.eqns):
    used = [v in live for v in eqn.outvars]
    if not any(used):
      continue
    inner = _inner(eqn)
    needed = _live_inputs(inner, used) if inner is not None else [True] * len(eqn.invars)
    live.update(v for v, n in zip(eqn.invars, needed) if n and isinstance(v, core.Var))
  return [v in live for v in jaxpr.invars]


def untrained_parameters(loss_fn, params, *inputs) -> list:
  """Names ("layer_2/ffn/kernel", ...) of the leaves of `params` on which `loss_fn(params, *inputs)`
  does not depend. Arguments may be abstract (`jax.ShapeDtypeStruct`)."""
  closed = jax.make_jaxpr(loss_fn)(params, *inputs)
  paths = [
    jax.tree_util.keystr(path, simple=True, separator="/")
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]
  ]
  live = _live_inputs(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
  return [path for path, used in zip(paths, live[: len(paths)]) if not used]


def untrained_student_parameters(teacher, student, objective, teacher_params, student_params) -> list:
  """The student parameters `objective` never trains, traced on one abstract sequence of 8 tokens
  through the train step's own loss (`Objective.student_terms`). The answer depends on the models,
  the objective and the parameters' shapes alone: traced once for each in a process (0.1-0.5 s of
  Python a run; a bench's rows and a grid's runs ask again with the same)."""
  return list(_untrained(teacher, student, objective, _shapes(teacher_params), _shapes(student_params)))


def _shapes(tree) -> tuple:
  """`tree`'s structure and its leaves' shapes and dtypes: hashable."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for leaf in leaves)


@functools.lru_cache(maxsize=32)
def _untrained(teacher, student, objective, teacher_shapes, student_shapes) -> tuple:
  teacher_params, student_params = (
    jax.tree.unflatten(treedef, leaves) for treedef, leaves in (teacher_shapes, student_shapes)
  )
  ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  batch = {
    "input_ids": ids,
    "attention_mask": ids,
    "token_type_ids": ids,
    **({"mlm_weights": jax.ShapeDtypeStruct((1, 8), jnp.float32)} if objective.needs.mlm_head else {}),
  }

  def teacher_outputs(params, batch):
    return objective.outputs(teacher, params, batch, objective.teacher_layers_needed)

  def loss(params, teacher_out, batch):
    return sum(objective.student_terms(student, params, teacher_out, batch).values())

  return tuple(
    untrained_parameters(loss, student_params, jax.eval_shape(teacher_outputs, teacher_params, batch), batch)
  )
