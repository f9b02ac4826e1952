"""`memory` suite: peak temporary memory of the compiled MiniLM loss + gradient, from XLA's memory
analysis, for the full relation tensors and for the query-chunked computation."""

import jax
import jax.numpy as jnp

from minilm_jax.models.encoder import LayerOutput
from minilm_jax.transfer import relations


def _layer(batch, heads, length, head_dim):
  x = jax.ShapeDtypeStruct((batch, heads, length, head_dim), jnp.float32)
  # Shapes to lower the loss with, not arrays; the relation loss reads q, k and v alone.
  return LayerOutput(q=x, k=x, v=x, attention=None, hidden=None)  # type: ignore[arg-type]


def _temp_bytes(teacher, student, mask, query_chunk):
  def loss(s, t, m):
    return sum(relations.minilm_loss(t, s, m, ("qk", "vv"), 12, query_chunk).values())

  compiled = jax.jit(jax.value_and_grad(loss)).lower(student, teacher, mask).compile()
  analysis = compiled.memory_analysis()
  if analysis is None:
    raise RuntimeError(
      f"{jax.default_backend()}'s compiler gives no memory analysis: run the memory suite on a CPU, GPU or TPU"
    )
  return analysis.temp_size_in_bytes


def run(batch_size: int = 8, query_chunk: int = 64, seq_lens=(128, 256, 512)):
  """A BERT-base teacher layer (12 heads x 64) and a 384-wide student layer (12 heads x 32), 12 relation heads."""
  rows = []
  for length in seq_lens:
    teacher, student = _layer(batch_size, 12, length, 64), _layer(batch_size, 12, length, 32)
    mask = jax.ShapeDtypeStruct((batch_size, length), jnp.int32)
    full = _temp_bytes(teacher, student, mask, 0)
    chunked = _temp_bytes(teacher, student, mask, query_chunk)
    rows.append(
      {
        "seq_len": length,
        "batch": batch_size,
        "query_chunk": query_chunk,
        "full_bytes": full,
        "chunked_bytes": chunked,
        "chunked_over_full": chunked / full,
      }
    )
  return rows
