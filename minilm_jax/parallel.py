"""Device mesh and batch placement: the same code on one CPU, 8 fake devices, or a pod."""

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from minilm_jax.errors import UserError

DATA = "data"


def make_mesh(num_devices: int = -1) -> Mesh:
  """A 1-D mesh over `num_devices` devices (-1: all of them, across every process) with axis `data`."""
  devices = jax.devices()
  n = len(devices) if num_devices == -1 else num_devices
  if not 0 < n <= len(devices):
    raise UserError(f"mesh asks for {num_devices} devices but {len(devices)} are available: use -1 for all")
  return Mesh(np.asarray(devices[:n]), (DATA,))


def check_batch_divides(global_batch: int, mesh: Mesh):
  n = mesh.shape[DATA]
  if global_batch % n or global_batch % jax.process_count():
    raise UserError(f"batch_size {global_batch} does not divide over {n} devices in {jax.process_count()} processes: "
                    f"use a multiple of {n}")


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows of a global batch -> global arrays sharded over `data`."""
  sharding = NamedSharding(mesh, P(DATA))
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
