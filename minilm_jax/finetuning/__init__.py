"""Fine-tuning, evaluation and multi-task training: the sharded steps, the runs, `results.json`."""
