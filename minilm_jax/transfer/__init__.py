"""What a student learns from a teacher: MiniLM's relation KLs (`relations`), the registry of
distillation objectives (`objectives`), shared by general distillation (`distill/`) and the second
stage of a fine-tuning run (`finetuning/distillation.py`), and the logit objectives (`logits`) that
task distillation and that second stage share."""
