"""Multi-process start-up: JAX's multi-controller runtime, asked for by the launcher.

A launcher sets MINILM_DISTRIBUTED=1 for every process. The coordinator, the process count and
this process's index come from MINILM_COORDINATOR / MINILM_NUM_PROCESSES / MINILM_PROCESS_ID
when given, else from the cluster (`jax.distributed.initialize` detects TPU pods and SLURM).
On CPUs the processes exchange collectives through gloo, so several CPU processes on loopback run
the same code path as a pod.
"""

import hashlib
import json
import os
import socket
import time

import jax
import numpy as np

from minilm_jax.errors import UserError

ENV_FLAG = "MINILM_DISTRIBUTED"


def maybe_initialize():
  """Joins the other processes when the launcher asks for it (env MINILM_DISTRIBUTED=1); else a no-op."""
  if os.environ.get(ENV_FLAG, "") not in ("1", "true"):
    return
  coordinator = os.environ.get("MINILM_COORDINATOR") or None
  num = os.environ.get("MINILM_NUM_PROCESSES")
  index = os.environ.get("MINILM_PROCESS_ID")
  timeout = int(os.environ.get("MINILM_INIT_TIMEOUT", "300"))
  # `jax_platforms` is a config option jax's type stubs do not declare: read from the option table.
  if jax.config.values.get("jax_platforms") in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator and index not in (None, "0"):
    _wait_for_coordinator(coordinator, timeout, index, num)
  if coordinator and index == "0":
    _check_port_free(coordinator)
  try:
    jax.distributed.initialize(
      coordinator_address=coordinator,
      num_processes=int(num) if num else None,
      process_id=int(index) if index else None,
      initialization_timeout=timeout,
    )
  except Exception as e:  # the runtime raises several types (RuntimeError, XlaRuntimeError, ValueError)
    raise UserError(
      f"could not join the distributed run (coordinator {coordinator or 'from the cluster'}, "
      f"process {index} of {num}) within {timeout}s: {type(e).__name__}: "
      f"{' '.join(str(e).split())[:200]}; check that every process was started and the address is reachable"
    ) from None


def _check_port_free(address: str):
  """Process 0 serves the coordinator at `address`: a port already taken (another run, or a process
  left over from one) would crash the runtime with a segmentation fault, so it is one line here."""
  host, _, port = address.rpartition(":")
  with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
    # As the runtime's server binds: a port whose last run's connections linger in TIME_WAIT is free.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind((host.strip("[]"), int(port)))
    except OSError as e:
      raise UserError(
        f"the coordinator's address {address} is taken ({e.strerror}): another run, or a process left over "
        f"from one, listens there; stop it or choose another port (launch/local.sh PORT=..., or MINILM_COORDINATOR)"
      ) from None


def _wait_for_coordinator(address: str, timeout: int, index, num):
  """Waits (bounded) until the coordinator accepts connections. The runtime itself aborts the whole
  process when it cannot reach it, so an unreachable address must be caught here to get one line."""
  host, _, port = address.rpartition(":")
  deadline = time.monotonic() + timeout
  while True:
    try:
      socket.create_connection((host, int(port)), timeout=1).close()
      return
    except OSError as e:
      if time.monotonic() > deadline:
        raise UserError(
          f"could not join the distributed run: coordinator {address} unreachable from process {index} of "
          f"{num} after {timeout}s ({e.strerror or e}); start process 0 first and check the address"
        ) from None
      time.sleep(0.5)


def check_same_config(config_json: str):
  """Stops every process with one line when the processes were not started with the same config."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils

  digest = np.frombuffer(hashlib.sha256(config_json.encode()).digest()[:8], np.int64)
  digests = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1)
  if len(set(digests.tolist())) > 1:
    differing = [i for i, d in enumerate(digests) if d != digests[0]]
    raise UserError(
      f"the {jax.process_count()} processes disagree on the config (processes {differing} differ from "
      f"process 0): start every process with the same command and overrides"
    )


def host_scalars(tree):
  """Replicated (possibly multi-process) arrays -> numpy, read from this process's own copy."""
  return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else np.asarray(x), tree)


def config_json(config) -> str:
  return json.dumps(json.loads(config.to_json()), sort_keys=True)
