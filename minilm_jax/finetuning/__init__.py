"""Fine-tuning and multi-task training (their evaluation is `evaluation/`'s): the fine-tuning run
(`run`), the epoch loop every fine-tuning-style run goes through and `results.json` (`fit`), the
sharded steps (`steps`), the second stage that learns a fine-tuned teacher (`distillation`) and its
teachers' cached logits (`teachers`), the multi-task trainer (`multitask`), the hyper-parameter grid
(`grid`) and the defaults (`config`)."""
