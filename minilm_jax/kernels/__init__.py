"""Fused Pallas kernels for the distillation step's [batch, heads, length, length] work.

- `attention.flash_attention`: the students' attention with dropout, flash-style: scores,
  probabilities, the dropout mask and their gradients live in on-chip memory one block at a time
  and are never written to HBM; the mask is made inside the kernel from a per-step seed
  (`dropout.keep_mask`, one hashed 32-bit word for four keys), forward and backward alike.
- `relation_kl.relation_kl_rows`: MiniLM's relation KLs (attention transfer, value relation,
  MiniLMv2's Q-Q/K-K/V-V) with teacher and student relation logits built block by block under an
  online log-sum-exp, the backward pass recomputing them.

Each kernel lowers through Pallas to Triton on GPUs and to Mosaic on TPUs, and runs in Pallas's
interpret mode on CPUs (the tests); `layout` says how their operands sit in each chip's memory and
how they compute on them. `platform.kernel_platform` says which a step compiled for some devices
should use, `platform.tiling_for` how it cuts them (the tilings `bench kernels --tune` measured per
chip, `tuned_tilings.json`); the encoder and the objectives keep their explicit XLA paths on CPUs.
`costs` counts what each kernel computes (products, exponentials, vector instructions, bytes): the
compiled program's check, the step's parts and each kernel's bound read it.
"""
