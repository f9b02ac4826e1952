"""A run's students (`config.family`): a family of students distilled from one teacher in one run,
the teacher's forward pass, three quarters of a BERT-base -> 6x384 step, computed once a batch for
all of them. A lone run is a family of one, its student named `step.LONE`.

A family config is a distillation config with a `family` field, a tuple of entries, one a student:
`dict(name="6x384", student=dict(num_layers=6), optimizer=dict(lr=3e-4))`. An entry overrides what
only a student reads (its `student`, `loss`, `etd` and `optimizer` fields, and `teacher.layer`, the
teacher layer it learns); the teacher, the corpus and its batch order, the batch size, the steps,
the dtype, the seed, the evaluators and the checkpoints are the family's. Each student is built as
the student of its own config would be and trained by the run's one step (`step.build_train_step`)
as it would be alone: the same parameters after the same steps, from the same seed and batches.

One run record and one checkpoint hold every student (the state's `params` and `opt_state` keyed by
name; the record's `students`, each student's own record); metrics and evaluations are logged under
each student's name (`6x384/loss`, `6x384/eval/...`); `python -m minilm_jax.convert --to-hf --student
6x384` exports one.
"""

import copy

import ml_collections

from minilm_jax.errors import UserError

LONE = ""  # the name of a lone run's one student: its state and metrics are not keyed by name

# What an entry may set: the blocks only a student reads, and of the teacher's block the layer it learns.
STUDENT_BLOCKS = ("student", "loss", "etd", "optimizer")
TEACHER_FIELDS = ("layer",)
# Of the optimizer block, what the family's one batch split fixes for every student.
FAMILY_OPTIMIZER_FIELDS = ("accumulate_steps",)


def members(config) -> dict:
  """{name: that student's whole distillation config}: `{LONE: config}` for a lone run; for a family,
  the family's config with each entry's overrides. One line for an entry that is not a student's, a
  name given twice, a field no config has, or one that is the family's."""
  if "family" not in config:
    return {LONE: config}
  if config.checkpoint.best:
    raise UserError(
      f"checkpoint.best={config.checkpoint.best} picks one step for one student: a family keeps its "
      "latest checkpoints (leave checkpoint.best empty, or distil that student alone)"
    )
  members = {}
  # `--config.family=` on the command line is the tuple of one empty string: a family of none.
  for i, given in enumerate(e for e in config.family if e != ""):
    if not isinstance(given, dict | ml_collections.ConfigDict):
      raise UserError(
        f"family entry {i} is {given!r}, not a student: give each as a dict, "
        f'e.g. dict(name="6x384", student=dict(num_layers=6))'
      )
    entry = dict(given)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
      raise UserError(f'family entry {i} has no name: give each student one, e.g. dict(name="6x384", ...)')
    if "/" in name or name != name.strip():
      raise UserError(
        f"family entry {i} is named {name!r}: a student's name has no '/' (it names its metrics) and no "
        "spaces at its ends"
      )
    if name in members:
      raise UserError(f"family: two students are named {name!r}: give each its own name")
    c = copy.deepcopy(config)
    with c.unlocked():
      del c["family"]
    for block, fields in entry.items():
      if block != "name":
        _override(c, name, block, fields)
    members[name] = c
  if not members:
    raise UserError("family is empty: list at least one student, or leave the field out for one student")
  return members


def _override(c, name: str, block: str, fields):
  """`c[block][field] = value` for an entry's block, refusing what a student may not set alone."""
  allowed = TEACHER_FIELDS if block == "teacher" else None
  if block not in STUDENT_BLOCKS and block != "teacher":
    raise UserError(
      f"family student {name}: {block!r} is the family's (one teacher, corpus, batch order and schedule): "
      f"a student sets {', '.join(STUDENT_BLOCKS)} and teacher.layer"
    )
  if not isinstance(fields, dict | ml_collections.ConfigDict):
    raise UserError(f"family student {name}: {block} must be a dict of its fields, e.g. {block}=dict(...)")
  for field, value in dict(fields).items():
    if field not in c[block] or (allowed is not None and field not in allowed):
      raise UserError(f"family student {name}: {block}.{field} is no field a student sets alone")
    if block == "optimizer" and field in FAMILY_OPTIMIZER_FIELDS:
      raise UserError(f"family student {name}: optimizer.{field} is the family's: set it once, outside `family`")
    c[block][field] = value


def said_of(name: str, fn, *args):
  """`fn(*args)`, its one-line error said of the family's student `name` (as it is for a lone run)."""
  if name == LONE:
    return fn(*args)
  try:
    return fn(*args)
  except UserError as e:
    raise UserError(f"family student {name}: {e}") from None
