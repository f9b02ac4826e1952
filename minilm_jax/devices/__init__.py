"""The devices a program runs on: the mesh and sharding (`parallel`), multi-process start-up and
host reads (`distributed`), the accelerator chips' table (`chips`), and timing on them with their
peak FLOP/s (`timing`)."""
