"""Task-specific and multi-task distillation (the thesis): a fine-tuned teacher's logits learnt by a
small student. `config` (the defaults), `losses` (the objectives' registry), `run` (the run: teacher
logits, augmentation, the students, MKD's learning-rate grid); the multi-task trainer they share
with the refined teacher is `finetuning.multitask`."""
