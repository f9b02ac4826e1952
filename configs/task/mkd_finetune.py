"""MKD's last stage (thesis section 4.3.2): a multi-task distilled student fine-tuned on each task.

  python -m minilm_jax.distill_task --config configs/task/mkd_finetune.py --workdir <dir> \
      --config.student.from_run=<MKD run (mkd_lstm.py or mkd_transformer.py)> \
      --config.tasks=<one of its tasks> --config.teacher=<its teacher>

"For further performance improvement, we fine-tune the student model for each task after MTL
distilled. During fine-tuning, the parameters of both shared layers and upper task-specific layers
are updated. The learning rate is chosen from {1, 1.5, 5} x 1e-5 according to the validation set
loss on each task. Other parameters remain the same as above." So: the MKD student's body and the
task's head (the Transformer student keeps its mean-[CLS] readout) go on from `student.from_run`,
one run per learning rate, the lowest dev loss (against the gold labels) chosen; Adam, batch 128,
16 epochs, clipping at 1 and masking augmentation as MKD. What the student is fine-tuned against the
thesis leaves open: "other parameters remain the same" keeps MKD's objective, the teacher's logits on
the task's augmented set; `--config.objective=hard` fine-tunes on the gold labels (no teacher).
"""

from minilm_jax.task_distill.config import mkd_config, student_from_run


def get_config():
  c = student_from_run(mkd_config())  # the student's fields are the MKD run's
  c.tasks = "wordnet_supersense"
  c.student.from_run = ""  # required: the MKD run
  c.lr_grid = "1e-5,1.5e-5,5e-5"
  return c
