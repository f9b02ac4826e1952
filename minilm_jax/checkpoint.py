"""Orbax checkpoints of a run: the train state, the data-stream position and the run's metadata.

A workdir holds `checkpoints/<step>/{state,data,meta}`. Saves are asynchronous (the arrays are
copied to host before `save` returns, so the state can be donated right after). Orbax writes each
step to a temporary directory and renames it when complete, so an interrupted save never shadows
the previous checkpoint.
"""

import os

import orbax.checkpoint as ocp

from minilm_jax.errors import UserError

ITEMS = ("state", "data", "meta")


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def is_run(path: str) -> bool:
  """Whether `path` is the workdir of a run of ours (as opposed to a Hugging Face directory)."""
  return os.path.isdir(checkpoint_dir(path))


class RunCheckpoints:

  def __init__(self, workdir: str, every: int = 1, keep: int = 3, read_only: bool = False):
    if read_only:
      options = ocp.CheckpointManagerOptions(read_only=True, enable_async_checkpointing=False, create=False,
                                             save_interval_steps=0)
    else:
      for field, value in (("checkpoint.every", every), ("checkpoint.keep", keep)):
        if value < 1:
          raise UserError(f"{field}={value}: it must be at least 1 (a run keeps at least its latest checkpoint)")
      options = ocp.CheckpointManagerOptions(max_to_keep=keep)
    self.every = every
    self.manager = ocp.CheckpointManager(checkpoint_dir(workdir), item_names=ITEMS, options=options)

  def latest_step(self):
    return self.manager.latest_step()

  def due(self, step: int) -> bool:
    """Whether the periodic schedule saves `step` (the training loop also saves the last step)."""
    return step % self.every == 0

  def save(self, step: int, state, data_position: dict, meta: dict) -> bool:
    """Saves `step` now; the caller decides when (`due`, the last step, a preemption)."""
    return self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position), meta=ocp.args.JsonSave(meta)))

  def read_meta(self, step=None) -> dict:
    step = self._step(step)
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def restore(self, abstract_state, step=None):
    """(state, data position, meta) of `step` (default latest), placed as `abstract_state`'s shardings say."""
    step = self._step(step)
    out = self.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    return out.state, out.data, out.meta

  def restore_params(self, abstract_params, step=None):
    """Only the parameters of a saved train state (a teacher needs no optimizer state)."""
    step = self._step(step)
    target = {"params": abstract_params}
    out = self.manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
    return out.state["params"]

  def _step(self, step):
    step = self.latest_step() if step is None else step
    if step is None or step not in self.manager.all_steps():
      raise UserError(f"no complete checkpoint{'' if step is None else f' at step {step}'} in {self.manager.directory}: "
                      f"steps there are {list(self.manager.all_steps())}")
    return step

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()
