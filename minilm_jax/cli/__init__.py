"""What every program (`python -m minilm_jax.<program>`) shares around its work: start-up, the one
line a bad input gets and the exit codes (`program`), and the outputs it writes: folders and files
written whole beside their place, checked before any work, never over an input (`outputs`)."""
