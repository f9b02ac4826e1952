"""Encoder shapes by name (`6x384`) and model FLOPs per token of the encoder and of a MiniLM step,
counted analytically (the benchmarks' utilisation and `aot`'s check of what XLA counts)."""

from minilm_jax.errors import UserError
from minilm_jax.models.encoder import EncoderConfig


def parse_shape(spec: str) -> EncoderConfig:
  """'6x384' (12 heads when they divide the width, else 64-wide heads) or '6x384x6' -> a BERT config."""
  try:
    parts = [int(p) for p in spec.lower().split("x")]
    layers, hidden = parts[:2]
    heads = parts[2] if len(parts) == 3 else (12 if hidden % 12 == 0 else max(1, hidden // 64))
    if len(parts) not in (2, 3) or min(parts) < 1:
      raise ValueError
  except ValueError:
    raise UserError(f"model shape {spec!r} is not LAYERSxHIDDEN or LAYERSxHIDDENxHEADS (e.g. 6x384): fix it") from None
  return EncoderConfig(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=4 * hidden)


def layer_flops_per_token(hidden: int, intermediate: int, length: int) -> int:
  """Forward FLOPs of one Transformer layer per token at sequence length `length`: the Q/K/V/output
  projections (8 d^2), the feed-forward block (4 d i), the scores and the weighted sum (4 S d).
  With i = 4d: 24 d^2 + 4 S d."""
  return 8 * hidden * hidden + 4 * hidden * intermediate + 4 * length * hidden


def encoder_flops_per_token(config, length: int) -> int:
  return config.num_layers * layer_flops_per_token(config.hidden_size, config.intermediate_size, length)


def distill_flops_per_token(
  teacher, teacher_layer: int, student, student_layer: int, length: int, num_relations: int = 2
) -> int:
  """Model FLOPs per token of one MiniLM step, counting only what the step must compute: each model's
  layers below the one the loss reads in full, plus that layer's Q/K/V (6 d^2) and the relation
  logits (2 S d each); the student's share three times (forward and backward)."""

  def share(config, layer):
    d = config.hidden_size
    below = layer * layer_flops_per_token(d, config.intermediate_size, length)
    return below + 6 * d * d + num_relations * 2 * length * d

  return share(teacher, teacher_layer) + 3 * share(student, student_layer)
