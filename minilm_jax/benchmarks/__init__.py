"""Benchmark suites of `python -m minilm_jax.bench`: each returns a list of row dicts. The
distillation step against PyTorch (`distill`, the PyTorch step in `torch_peer`; where its time
goes: `profile`), the fused kernels (`kernels`), inference (`inference`), memory (`memory`), ETD
(`etd`), task distillation (`task_distill`), the thesis students' speed (`student_speed`, ELMo's
published shape beside them: `elmo`), the input pipeline (`data`), which student to fine-tune
(`students`), generation (`generation`)."""
