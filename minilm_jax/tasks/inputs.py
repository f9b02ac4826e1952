"""The inputs a sentence(-pair) classification or regression task's model reads, shared by multi-task
training, task distillation and evaluation: a Transformer reads the joint `[CLS] a [SEP] b [SEP]`
sequence, an LSTM student each sentence on its own."""

import datasets
import jax.numpy as jnp

from minilm_jax.data.corpus import map_batches
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import dummy_ids
from minilm_jax.tasks import get_task
from minilm_jax.tasks.glue import ClassificationTask

SEPARATE_INPUTS = ("input_ids", "attention_mask")
PAIR_INPUTS = ("input_ids_b", "attention_mask_b")
JOINT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def is_pair(task) -> bool:
  return len(task.text_columns) > 1


def model_inputs(joint: bool, task) -> tuple:
  """The batch columns a model reads for `task`: the joint sequence, or each sentence on its own."""
  return JOINT_INPUTS if joint else SEPARATE_INPUTS + PAIR_INPUTS * is_pair(task)


def dummy_batch(joint: bool, tasks) -> dict:
  """What `init` traces a multi-task model with: {task name: a batch of the columns it reads, one
  sequence of ones} (parameter shapes do not depend on its length)."""
  return {task.name: {k: jnp.ones_like(dummy_ids()) for k in model_inputs(joint, task)} for task in tasks}


def parse_tasks(spec: str) -> list:
  tasks = [get_task(name.strip()) for name in spec.split(",") if name.strip()]
  if not tasks:
    raise UserError("no task given: name a task, or a comma list of tasks for multi-task training")
  for task in tasks:
    if not isinstance(task, ClassificationTask):
      raise UserError(
        f"{task.name} is not a sentence(-pair) classification or regression task: multi-task "
        f"training and task distillation take GLUE-style tasks"
      )
  return tasks


def task_data_dirs(tasks, data_dir: str) -> dict:
  """{task name: its data folder}. `data_dir` is one folder for every task (empty: the hub), or a
  comma list of one folder per task, in the order of the tasks (GLUE keeps each task in its own)."""
  dirs = [d.strip() for d in data_dir.split(",")] if data_dir else [""]
  if len(dirs) == 1:
    return {t.name: dirs[0] for t in tasks}
  if len(dirs) != len(tasks):
    raise UserError(
      f"data_dir names {len(dirs)} folders for {len(tasks)} tasks ({', '.join(t.name for t in tasks)}): "
      f"give one folder per task, in the same order, or one folder for all"
    )
  return {t.name: d for t, d in zip(tasks, dirs)}


def task_features(joint: bool, task, examples: datasets.Dataset, tokenizer, max_len: int) -> datasets.Dataset:
  """Model inputs plus `label`: the `[CLS] a [SEP] b [SEP]` sequence (`joint`, the Transformers), or
  each sentence on its own without special tokens (the LSTMs)."""
  if joint:
    return task.features(examples, tokenizer, max_len)

  def tokenize(batch):
    out = {"label": batch["label"]}
    for column, (ids, mask) in (("text_a", SEPARATE_INPUTS), ("text_b", PAIR_INPUTS))[: 1 + is_pair(task)]:
      enc = tokenizer(
        batch[column], add_special_tokens=False, truncation=True, max_length=max_len, padding="max_length"
      )
      out[ids], out[mask] = enc["input_ids"], enc["attention_mask"]
    return out

  return map_batches(examples, tokenize, f"tokenise {task.name}")
