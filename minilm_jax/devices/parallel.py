"""Device mesh and batch placement: the same code on one CPU, 8 fake devices, or a pod.

The mesh has two axes: `data` (batch split) and `model` (parameters split, Megatron-style, by the
rules of `minilm_jax.models.sharding`). Distillation uses `data` only; fine-tuning and evaluation
use both through `jax.jit` shardings.
"""

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from minilm_jax.errors import UserError

DATA, MODEL = "data", "model"


def make_mesh(num_data: int = -1, num_model: int = 1, devices=None) -> Mesh:
  """A `data` x `model` mesh; num_data -1 takes every device (of every process) left after `model`.
  `devices` default to the attached ones (`jax.devices()`); `minilm_jax.aot` passes a TPU slice's
  or GPU cluster's compile-only devices."""
  devices = jax.devices() if devices is None else list(devices)
  if num_model < 1 or len(devices) % num_model:
    raise UserError(f"mesh.model={num_model} does not divide the {len(devices)} devices: choose a divisor")
  n = len(devices) // num_model if num_data == -1 else num_data
  if not 0 < n * num_model <= len(devices):
    raise UserError(f"mesh asks for {num_data} x {num_model} devices but {len(devices)} are available: use -1 for all")
  hosts = len({d.process_index for d in devices})
  if hosts > 1 and n * num_model < len(devices):
    # Every process reads an equal share of each batch onto its own devices: each must be in the mesh, whole.
    raise UserError(
      f"mesh asks for {n} x {num_model} of the {len(devices)} devices of {hosts} processes: "
      "a run of several processes uses them all (mesh.data=-1)"
    )
  return Mesh(np.asarray(devices[: n * num_model]).reshape(n, num_model), (DATA, MODEL))


def placed(abstract_tree, shardings):
  """`abstract_tree`'s shapes and dtypes with `shardings` (a tree of them, or one for every leaf):
  the target that restores a checkpoint (or builds a state, or is compiled for) straight onto a mesh."""
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, abstract_tree)
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(DATA))


def check_batch_divides(global_batch: int, mesh: Mesh):
  n = mesh.shape[DATA]
  if global_batch % n or global_batch % jax.process_count():
    raise UserError(
      f"batch_size {global_batch} does not divide over {n} devices in {jax.process_count()} processes: "
      f"use a multiple of {n}"
    )


def traced_on_mesh(fn, mesh: Mesh):
  """`fn` traced under `mesh`'s abstract mesh, so that kernel choices made while tracing
  (`kernels.platform.compute_platform`) follow the devices the jitted function is compiled for. A
  `shard_map` body sees its mesh already; a `jax.jit` with shardings needs this."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return wrapped


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows of a global batch -> global arrays sharded over `data`. Entries that are
  not arrays (a multi-task batch's task name) pass through."""
  sharding = batch_sharding(mesh)
  return {
    k: jax.make_array_from_process_local_data(sharding, v) if isinstance(v, np.ndarray) else v
    for k, v in local_batch.items()
  }
