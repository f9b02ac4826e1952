"""The evaluation wing: batched, sharded inference (`predictor`), the evaluator registry that
distillation runs call while they train (`evaluators`), the sentence encoder and the embedding
protocol (`sentences`: retrieval, STS, unrelated cosine), and the `evaluate` program's evaluation of
fine-tuned runs and their prediction files (`finetuned_runs`). Distillation and fine-tuning import
it, not each other."""
