"""Task-specific and multi-task distillation (the thesis): a fine-tuned teacher's logits learnt by a
small student. `config` (the defaults), `run` (the run: teacher logits, augmentation, the students,
MKD's learning-rate grid); the logit objectives are `transfer.logits`, and the multi-task trainer
they share with the refined teacher is `finetuning.multitask`."""
