"""`inference` suite: MiniLM table 4, encoder forward time per batch at the paper's architectures,
and the speed-up over 12x768 next to the paper's (measured there on a P100 GPU). `flop_ratio` is
12x768's compiled FLOPs over the architecture's: the speed-up a device would show if time
followed FLOPs exactly."""

import jax
import numpy as np

from minilm_jax.benchmarks.timing import block, median_seconds
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params

# (layers, hidden, the paper's speed-up over 12x768)
ARCHITECTURES = ((12, 768, 1.0), (6, 768, 2.0), (12, 384, 2.7), (6, 384, 5.3), (4, 384, 7.8), (3, 384, 10.1))


def run(repeats: int = 3, dtype: str = "float32", batch_size: int = 8, seq_len: int = 128):
  rng = np.random.default_rng(0)
  ids = rng.integers(1000, 30000, (batch_size, seq_len)).astype(np.int32)
  mask = np.ones_like(ids)
  rows, base, base_flops = [], None, None
  for layers, hidden, paper in ARCHITECTURES:
    config = EncoderConfig(num_layers=layers, hidden_size=hidden, num_heads=12, intermediate_size=4 * hidden, dtype=dtype)
    params = init_params(config, jax.random.key(0))
    forward = jax.jit(lambda p, i, m, model=Encoder(config): model.apply({"params": p}, i, m).last_hidden_state)
    seconds = median_seconds(lambda: block(forward(params, ids, mask)), repeats)
    flops = forward.lower(params, ids, mask).compile().cost_analysis()["flops"]
    base, base_flops = base or seconds, base_flops or flops
    rows.append({"arch": f"{layers}x{hidden}", "batch": batch_size, "seq_len": seq_len, "dtype": dtype,
                 "seconds": seconds, "speedup": base / seconds, "paper_speedup": paper,
                 "flop_ratio": base_flops / flops})
  return rows
