"""`inference` suite: MiniLM table 4, encoder forward time per batch at the paper's architectures,
with the paper's protocol (the average over 100 batches of one fixed length), and the speed-up
over 12x768 next to the paper's (measured there on a P100 GPU). `flop_ratio` is 12x768's analytic
FLOPs over the architecture's: the speed-up a device would show if time followed FLOPs exactly."""

import functools
import time

import jax
import numpy as np

from minilm_jax.devices.timing import block, timing_params
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.models.flops import encoder_flops_per_token

# (layers, hidden, the paper's speed-up over 12x768)
ARCHITECTURES = ((12, 768, 1.0), (6, 768, 2.0), (12, 384, 2.7), (6, 384, 5.3), (4, 384, 7.8), (3, 384, 10.1))


def _last_hidden_state(model, params, input_ids, attention_mask):
  return model.apply({"params": params}, input_ids, attention_mask).last_hidden_state


def run(num_batches: int = 100, dtype: str = "float32", batch_size: int = 8, seq_len: int = 128):
  rng = np.random.default_rng(0)
  batches = [rng.integers(1000, 30000, (batch_size, seq_len)).astype(np.int32) for _ in range(min(num_batches, 4))]
  mask = np.ones((batch_size, seq_len), np.int32)
  rows, base, base_flops = [], None, None
  for layers, hidden, paper in ARCHITECTURES:
    config = EncoderConfig(
      num_layers=layers, hidden_size=hidden, num_heads=12, intermediate_size=4 * hidden, dtype=dtype
    )
    params = timing_params(functools.partial(init_params, config), rng)
    forward = jax.jit(functools.partial(_last_hidden_state, Encoder(config)))
    block(forward(params, batches[0], mask))  # compile
    start = time.perf_counter()
    outputs = [forward(params, batches[i % len(batches)], mask) for i in range(num_batches)]
    block(outputs)
    seconds = (time.perf_counter() - start) / num_batches
    flops = encoder_flops_per_token(config, seq_len)
    base, base_flops = base or seconds, base_flops or flops
    rows.append(
      {
        "arch": f"{layers}x{hidden}",
        "batch": batch_size,
        "seq_len": seq_len,
        "dtype": dtype,
        "seconds": seconds,
        "speedup": base / seconds,
        "paper_speedup": paper,
        "flop_ratio": base_flops / flops,
      }
    )
  return rows
