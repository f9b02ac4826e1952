"""`data` suite: does the batch stream keep a GPU fed? Blocks per second of one process's stream
(gather + collate, what the training loop's prefetch thread runs), tokenising on the fly (Arrow
rows, padded in Python) and from a prepared corpus (memory-mapped shards, one numpy gather), beside
what one H100 step consumes; the prepared corpus's tokens per second handed to the device as the
`train` program does (the prefetch thread placing each batch on the mesh), against the kernels
issue's step goal; and the preparation's own speed and size on disk.

Corpus: the demo corpus with the real all-MiniLM-L6-v2 tokenizer, global batch 256.
"""

import os
import statistics
import tempfile
import time
from functools import partial

import jax
import ml_collections

from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, load_blocks
from minilm_jax.data.prepared import corpus_blocks, write_prepared
from minilm_jax.devices import parallel
from minilm_jax.distill.config import demo_teacher
from minilm_jax.training.loop import Prefetcher

BATCH = 256
# Blocks per second one H100 step consumes (bf16, 12x768 teacher -> 6x384 student, batch 256), from
# the step times measured for the GPU-throughput issue: 34.2 ms at length 128, 612k tokens/s at 512.
H100_DEMAND = {128: BATCH / 0.0342, 512: 612_000 / 512}
# The kernels issue's goal for one H100's step, tokens per second (twice torch.compile's at 512).
STEP_GOAL_TOKENS_PER_S = {128: 2.1e6, 512: 1.7e6}


def _blocks_per_second(stream, batches: int) -> float:
  """Median over `batches` consecutive batches (each timed alone) of blocks gathered and collated per second."""
  times = []
  for b in range(batches):
    start = time.perf_counter()
    stream.batch(b)
    times.append(time.perf_counter() - start)
  return stream.local_batch / statistics.median(times)


def _fed_tokens_per_second(stream, batches: int, length: int) -> float:
  """Tokens per second (full blocks of `length`) the training loop's input pipeline hands to the
  device, as the `train` program runs it: the prefetch thread reading, collating and placing each
  batch on the mesh (`loop.Prefetcher` with `parallel.shard_batch`), the consumer waiting for each
  batch to be on the device; timed after the first batch."""
  mesh = parallel.make_mesh()
  prefetcher = Prefetcher(stream, 0, batches, partial(parallel.shard_batch, mesh=mesh))
  try:
    jax.block_until_ready(prefetcher.next()[0])
    start = time.perf_counter()
    for _ in range(batches - 1):
      jax.block_until_ready(prefetcher.next()[0])
    seconds = time.perf_counter() - start
  finally:
    prefetcher.close()
  return (batches - 1) * stream.local_batch * length / seconds


def run(lengths=(128, 512), batches: int = 20, num_proc: int = 2) -> list:
  tokenizer = runs.load_tokenizer_of(demo_teacher())
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for length in lengths:
      data = ml_collections.ConfigDict(
        {
          "corpus": "demo",
          "corpus_config": "",
          "text_column": "text",
          "max_seq_length": length,
          "num_proc": num_proc,
          "prepared": "",
        }
      )
      cache, out = os.path.join(tmp, f"cache{length}"), os.path.join(tmp, f"prepared{length}")
      start = time.perf_counter()
      manifest = write_prepared(load_blocks(data, tokenizer, cache), tokenizer, length, out, 8, ["demo"])
      seconds = time.perf_counter() - start
      size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
      row = {
        "length": length,
        "blocks": manifest["blocks"],
        "prepare_tokens_per_s": round(manifest["tokens"] / seconds),
        "GB_per_billion_tokens": round(size / manifest["tokens"], 2),
      }
      for name, prepared in (("on_the_fly", ""), ("prepared", out)):
        data.prepared = prepared
        blocks, collate, _ = corpus_blocks(data, tokenizer, cache)
        stream = BatchStream(blocks, BATCH, 0, collate)
        rate = _blocks_per_second(stream, min(batches, len(blocks) // BATCH))
        row[f"{name}_blocks_per_s"] = round(rate)
        # Lengths the step was not measured at have no demand to compare with.
        row[f"{name}_x_h100_demand"] = round(rate / H100_DEMAND[length], 1) if length in H100_DEMAND else None
      fed = _fed_tokens_per_second(stream, batches, length)  # epochs on: the stream reshuffles as a run's does
      row["prepared_to_device_tokens_per_s"] = round(fed)
      goal = STEP_GOAL_TOKENS_PER_S.get(length)
      row["prepared_to_device_x_step_goal"] = round(fed / goal, 1) if goal else None
      rows.append(row)
  return rows
