"""Ahead-of-time compilation for accelerators that are not attached: `python -m minilm_jax.aot`.

XLA compiles a jitted function for a TPU slice or a GPU cluster from a CPU host (deviceless AOT);
the compiled program is the one the chips would run, so its memory footprint, FLOPs, kernels and
collectives are the accelerator's. `targets` names the chips and builds their compile-only
devices; `programs` builds each program's own step from shapes alone; `report` reads the
compiled program; `compiling` compiles it, and tells a program over the chip from a failure of the
compiler; `__main__` is the program.
"""
