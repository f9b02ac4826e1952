"""The devices a program runs on: the mesh, batches split over it and trees placed on it (`parallel`;
where parameters live is `models/sharding.py`'s), multi-process start-up and host reads
(`distributed`), the accelerator chips' table (`chips`), and timing on them with their peak FLOP/s
(`timing`)."""
