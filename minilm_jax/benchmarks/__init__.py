"""Benchmark suites of `python -m minilm_jax.bench`: each returns a list of row dicts."""
