"""Encoder shapes by name (`6x384`) and model FLOPs per token of the encoder and of a MiniLM step,
counted analytically (the benchmarks' utilisation and `aot`'s check of what XLA counts)."""

from typing import Any, NamedTuple

from minilm_jax.errors import UserError
from minilm_jax.kernels import costs
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


def layer_flops_per_token(hidden: int, intermediate: int, length: int, gated: bool = False) -> int:
  """Forward FLOPs of one Transformer layer per token where each query sees `length` keys: the
  Q/K/V/output projections (8 d^2), the feed-forward block (4 d i; 6 d i gated, GeGLU's second
  map), the scores and the weighted sum (4 S d). With i = 4d: 24 d^2 + 4 S d."""
  return 8 * hidden * hidden + (6 if gated else 4) * hidden * intermediate + 4 * length * hidden


def layers_flops_per_token(config, num_layers: int, length: int) -> int:
  """Forward FLOPs per token of `config`'s first `num_layers` layers at sequence length `length`: a
  sliding layer's queries see the keys of their window alone (ModernBERT's)."""

  def keys_seen(i):
    return min(length, config.local_window + 1) if i in config.sliding_layers else length

  d, i_size, gated = config.hidden_size, config.intermediate_size, config.architecture.gated_mlp
  return sum(layer_flops_per_token(d, i_size, keys_seen(i), gated) for i in range(num_layers))


def encoder_flops_per_token(config, length: int) -> int:
  return layers_flops_per_token(config, config.num_layers, length)


class LossLayer(NamedTuple):
  """A model's config and the layer of it the step's loss reads (the layers above it never run)."""

  config: Any
  layer: int


def distill_flops_per_token(teacher: LossLayer, student: LossLayer, length: int, num_relations: int = 2) -> int:
  """Model FLOPs per token of one MiniLM step, counting only what the step must compute: each model's
  layers below the one the loss reads in full, plus that layer's Q/K/V (6 d^2) and the relation
  logits (2 S d each); the student's share three times (forward and backward)."""

  def share(config, layer):
    d = config.hidden_size
    below = layers_flops_per_token(config, layer, length)
    return below + 6 * d * d + num_relations * 2 * length * d

  return share(*teacher) + 3 * share(*student)


def attention_kernel_flops(batch: int, length: int, width: int) -> tuple:
  """(forward, backward) FLOPs of one layer's attention products over heads of total `width`, as the
  kernel computes them (`kernels.costs`: the backward pass recomputes the probabilities)."""
  work = costs.attention(batch, 1, length, width, rate=0.0)
  return work[costs.ATTENTION_FORWARD].products, work[costs.ATTENTION_BACKWARD].products


def relation_kl_flops(batch: int, length: int, teacher_width: int, student_width: int) -> tuple:
  """(forward, backward) FLOPs of one relation KL's products, as the kernel computes them
  (`kernels.costs`: the backward pass recomputes both models' relation logits)."""
  work = costs.relation_kl(batch, 1, length, teacher_width, student_width)
  return work[costs.RELATION_KL_FORWARD].products, work[costs.RELATION_KL_BACKWARD].products


def distill_step_flops_by_part(
  teacher_read: LossLayer, student_read: LossLayer, batch: int, length: int, num_relations: int = 2
) -> dict:
  """Analytic FLOPs of one MiniLM step by the parts a profile splits it into
  (`benchmarks.profile.PARTS`), counting what the step computes (as `distill_flops_per_token`):
  the teacher's layers below the one the loss reads in full and that layer's Q/K/V; the student's
  projections and feed-forward blocks the same way, their backward pass twice the forward; its
  attention in the layers below the read one (`attention_kernel_flops`); the relations
  (`relation_kl_flops`)."""
  (teacher, teacher_layer), (student, student_layer) = teacher_read, student_read
  tokens = batch * length
  t_d, s_d = teacher.hidden_size, student.hidden_size
  ffn = (6 if student.architecture.gated_mlp else 4) * s_d * student.intermediate_size
  student_dense = tokens * (student_layer * (8 * s_d * s_d + ffn) + 6 * s_d * s_d)
  attention_forward, attention_backward = attention_kernel_flops(batch, length, s_d)
  relation_forward, relation_backward = relation_kl_flops(batch, length, t_d, s_d)
  return {
    "teacher forward": tokens * (layers_flops_per_token(teacher, teacher_layer, length) + 6 * t_d * t_d),
    "student dense forward": student_dense,
    "student dense backward": 2 * student_dense,
    "attention kernel forward": student_layer * attention_forward,
    "attention kernel backward": student_layer * attention_backward,
    "relation KL forward": num_relations * relation_forward,
    "relation KL backward": num_relations * relation_backward,
  }
