"""What a student learns from a teacher: MiniLM's relation KLs (`losses.py`) and the registry of
distillation objectives (`objectives.py`), shared by general distillation (`distill/`) and the
second stage of a fine-tuning run (`finetuning/distillation.py`)."""
