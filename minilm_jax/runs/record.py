"""A run's identity: what it is and how it was made, one typed record saved with every checkpoint.

Every program writes it through `RunCheckpoints.save` and every reader gets it from
`reading.read_record`: the kind of run, its config, its encoder, its task head or heads and tasks,
the task student's own settings, the parameters its objective never trained. The record is
versioned: records of this version are written as `to_json` gives them; those of the releases
before it (plain dicts with optional keys, no version) are read by `from_json` as well.
"""

import dataclasses

from minilm_jax.errors import UserError
from minilm_jax.models.encoder import EncoderConfig

VERSION = 1

DISTILLATION = "distillation"  # an encoder distilled from a teacher (`python -m minilm_jax.train`)
FINETUNING = "finetuning"  # an encoder with one task's head (`python -m minilm_jax.finetune`)
REFINED_TEACHER = "refined_teacher"  # one encoder with a head per task (MKD's multi-task teacher)
TASK_STUDENT = "task_student"  # a task-distilled student with a head per task (`python -m minilm_jax.distill_task`)
CONVERTED = "converted"  # a Hugging Face encoder as a run (`python -m minilm_jax.convert --from-hf`)


@dataclasses.dataclass(frozen=True)
class RunKind:
  """What readers do differently with a kind of run, declared once."""

  multi_task: bool = False  # params {"body": {...}, "head_<task>": ...}, read by `read_multitask_run`
  task_student: bool = False  # its body is a task student built from `task_student_settings` (else a Transformer)
  teaches_tasks: bool = False  # task distillation can learn its tasks from it (it has their heads)
  teacher_field: str = ""  # the config field that names its teacher(s), if it learns from one


KINDS = {
  DISTILLATION: RunKind(teacher_field="teacher.path"),
  FINETUNING: RunKind(teaches_tasks=True, teacher_field="distill.teacher"),
  REFINED_TEACHER: RunKind(multi_task=True, teaches_tasks=True, teacher_field="distill.teacher"),
  TASK_STUDENT: RunKind(multi_task=True, task_student=True, teacher_field="teacher"),
  CONVERTED: RunKind(),
}


@dataclasses.dataclass(frozen=True)
class RunRecord:
  """What a run is. `config` is the run's config as JSON (empty for a converted model); `encoder`
  None only for a task student without a Transformer (a BiLSTM)."""

  kind: str
  encoder: EncoderConfig | None
  config: dict = dataclasses.field(default_factory=dict)
  head: dict | None = None  # a fine-tuned model's task head ({"kind": "classification", ...})
  tasks: tuple[str, ...] = ()  # the task(s) its heads were trained on
  heads: tuple[tuple[str, int], ...] = ()  # a multi-task run's (task, outputs) per head
  # A task student's `student` settings (the key "student" in the record's file, as it always was).
  task_student_settings: dict = dataclasses.field(default_factory=dict)
  vocab_size: int = 0  # a task student's tokenizer size
  untrained: tuple[str, ...] = ()  # parameters the objective never trained (exported as initialised)
  heldout: dict | None = None  # the corpus blocks a distillation never trained on
  sentence_embedding: dict | None = None  # the teacher's pooling and the learnt Dense map's shape
  source: str | None = None  # the Hugging Face directory a converted run holds
  # A family of students distilled together (`distill.family`): each student's own record, by name;
  # the family's `encoder` is None and its `config` the family's.
  students: dict = dataclasses.field(default_factory=dict)
  # The teacher as the run read it (a distillation's `checkpoints.weights_digest`, a second stage's
  # teacher runs' `TeacherRun.content_digest`): a resume compares it (`check_same_teacher`).
  teacher_weights: str | None = None
  # The other inputs as the run read them, by the field that names each ({"data.prepared": digest of
  # the blocks its manifest lists}): a resume compares them (`check_same_inputs`).
  inputs: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.kind not in KINDS:
      raise UserError(f"unknown run kind {self.kind!r}: known kinds are {', '.join(KINDS)}")

  def transformer(self, where: str) -> EncoderConfig:
    """The run's Transformer encoder; a one-line error for a student that has none, and for a
    family, whose students each have their own (`member`)."""
    if self.students:
      raise UserError(
        f"{where} holds a family of students ({', '.join(self.students)}): name one, e.g. "
        f"python -m minilm_jax.convert --to-hf --student {next(iter(self.students))} exports it"
      )
    if self.encoder is None:
      raise UserError(
        f"{where} holds a {self.task_student_settings.get('kind')} student, which has no Transformer encoder to "
        f"load or export: its dev metrics are in results.json"
      )
    return self.encoder

  def member(self, name: str | None, where: str) -> "RunRecord":
    """The record of the family's student `name`; a one-line error for a name it lacks."""
    if name not in self.students:
      names = ", ".join(self.students)
      raise UserError(f"--student {name}: {where}'s students are {names}: name one of them")
    return RunRecord.from_json(self.students[name])

  @property
  def multi_task(self) -> bool:
    return KINDS[self.kind].multi_task

  @property
  def task_student(self) -> bool:
    return KINDS[self.kind].task_student

  @property
  def teaches_tasks(self) -> bool:
    return KINDS[self.kind].teaches_tasks

  @property
  def teacher(self) -> str | None:
    """The teacher it learnt from: a model path (distillation) or runs (task distillation)."""
    teacher = self.config.get("teacher")
    return teacher.get("path") if isinstance(teacher, dict) else teacher

  @property
  def named_by_content(self) -> set:
    """The config fields naming inputs the record holds a digest of (`teacher_weights`, `inputs`):
    a resume may find them at another path (another checkout, a moved folder), as the digest of
    what it reads there is compared with the record's."""
    teacher = KINDS[self.kind].teacher_field
    return set(self.inputs) | ({teacher} if teacher and self.teacher_weights is not None else set())

  @property
  def objective(self) -> str | None:
    return self.config.get("loss", {}).get("objective")

  def task_outputs(self, task: str) -> list | int:
    """What its output layer for `task` predicts: the class names of a fine-tuning run's head, else
    the number of outputs (a regression's head, a refined teacher's head for the task)."""
    if self.head is not None:
      return list(self.head["labels"]) if self.head.get("labels") else self.head.get("num_labels", 1)
    return dict(self.heads).get(task, 0)

  def to_json(self) -> dict:
    # The file's keys are the fields' names, in their order, but for the task student's settings.
    out = {("student" if k == "task_student_settings" else k): v for k, v in dataclasses.asdict(self).items()}
    out["encoder"] = None if self.encoder is None else self.encoder.to_dict()
    if not self.students:  # one student's record is written as it was before families
      del out["students"]
    if self.teacher_weights is None:  # the runs that distil from no teacher's weights
      del out["teacher_weights"]
    if not self.inputs:  # records of runs whose inputs are named by their config alone
      del out["inputs"]
    return {"version": VERSION, **out}

  @classmethod
  def from_json(cls, d: dict) -> "RunRecord":
    """A record of this version, or the untyped metadata of the releases before it."""
    version = d.get("version", 0)
    if not isinstance(version, int) or version > VERSION:
      raise UserError(
        f"this run's record has version {version!r}, newer than this minilm_jax reads ({VERSION}): "
        f"upgrade minilm_jax to read it"
      )
    fields = dict(d) if version else _from_unversioned(d)
    fields.pop("version", None)
    if "student" in fields:
      fields["task_student_settings"] = fields.pop("student")
    known = {f.name for f in dataclasses.fields(cls)}
    if set(fields) - known:
      raise UserError(f"this run's record has unknown fields {sorted(set(fields) - known)}: upgrade minilm_jax")
    encoder = fields.get("encoder")
    return cls(
      **{
        **fields,
        "encoder": None if encoder is None else EncoderConfig.from_dict(encoder),
        "tasks": tuple(fields.get("tasks", ())),
        "heads": tuple((task, int(width)) for task, width in fields.get("heads", ())),
        "untrained": tuple(fields.get("untrained") or ()),
      }
    )


def _from_unversioned(meta: dict) -> dict:
  """The fields of the metadata the releases before version 1 wrote: its kind told by `model`
  (the multi-task runs), `head` (fine-tuning) or `source` (a converted model); `task` for `tasks`."""
  fields = {k: v for k, v in meta.items() if k not in ("model", "task")}
  if meta.get("model") == "refined_teacher":
    fields["kind"] = REFINED_TEACHER
  elif meta.get("model") == "student":
    fields["kind"] = TASK_STUDENT
  elif "head" in meta:
    fields["kind"], fields["tasks"] = FINETUNING, [meta["task"]]
  elif "source" in meta:
    fields["kind"] = CONVERTED
  else:
    fields["kind"] = DISTILLATION
  fields.setdefault("encoder", None)
  return fields


def check_same_teacher(named: str, workdir: str, weights: str, record: RunRecord | None):
  """A run resumes only from the teacher it started with (`record`: the resumed run's; `named`: the
  field that names the teacher, with its value): the config check keeps the path, but a model
  rebuilt or retrained there would teach the rest of the run something else. Runs whose record
  predates the digest resume as before."""
  saved = None if record is None else record.teacher_weights
  if saved is not None and saved != weights:
    raise UserError(
      f"{named} holds other weights than the teacher {workdir} started from "
      f"(digest {saved[:12]}, now {weights[:12]}): put that teacher back, or start a new --workdir"
    )


def check_same_inputs(workdir: str, inputs: dict, record: RunRecord | None):
  """A run resumes only on the inputs it started with (`inputs`: {config field: (its value, a digest
  of what it holds now)}; `record`: the resumed run's): a corpus prepared anew at the same path would
  feed the rest of the run other blocks. Inputs the record does not hold (records written before) pass."""
  saved = {} if record is None else record.inputs
  for field, (value, digest) in inputs.items():
    if saved.get(field) is not None and saved[field] != digest:
      raise UserError(
        f"{field}={value} holds other content than {workdir} started with (digest {saved[field][:12]}, now "
        f"{digest[:12]}): put that one back, or start a new --workdir"
      )
