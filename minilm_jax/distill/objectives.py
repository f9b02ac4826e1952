"""Distillation objectives: MiniLM (the default) and the baselines the papers compare it with.

- "minilm": relation KLs of one teacher layer and one student layer (`losses.minilm_loss`).
- "layer_to_layer": the same relation KLs at several layer pairs of TinyBERT's uniform mapping
  (student layer m <- teacher layer m * L / M), transferred to the student's last layer, last two,
  first and last, or all layers (MiniLM supplementary table 8).
- "value_mse" / "hidden_mse": attention-distribution KL plus MSE against the teacher's last-layer
  values / hidden states (MiniLM table 6, supplementary table 7), through a learned linear map when
  the widths differ.
- "tinybert": ETD's last-layer objective: MSE of attention scores plus MSE of hidden states
  through a learned map W_h.
- "mlm_kd": soft-label distillation of the masked-LM distributions (MiniLM table 3's MLM-KD):
  KL(teacher || student) over the vocabulary at BERT-masked positions. The teacher needs its MLM
  head; the student learns its own (under "mlm_head"), tied to its word embeddings.
- "embedding": the sentence-embedding objective alone: MSE (or 1 - cosine) between the student's
  and the teacher's sentence embeddings, pooled and normalised as the teacher's sentence-transformers
  pipeline says (`embeddings.Pooling`). With `loss.embedding_weight` > 0 the same term is added to
  any relation objective. It reads both models' last layers, so it trains the whole student.

The learned maps live in the student's parameter tree under "projection" (ignored by the encoder
and by runs read as teachers; the embedding map is exported as a sentence-transformers Dense module).
"""

import dataclasses

import jax
import jax.numpy as jnp

from minilm_jax import embeddings
from minilm_jax.distill import losses
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import merge_heads

OBJECTIVES = ("minilm", "layer_to_layer", "value_mse", "hidden_mse", "tinybert", "mlm_kd", "embedding")
EMBEDDING_LOSSES = ("mse", "cosine")
LAYER_MAPS = ("last", "last_two", "first_and_last", "all")


def layer_pairs(teacher_layers: int, student_layers: int, variant: str) -> list:
  """(student layer, teacher layer) pairs, 0-based, of the uniform mapping restricted to `variant`."""
  if teacher_layers % student_layers:
    raise UserError(f"no uniform layer mapping from a {teacher_layers}-layer teacher to a {student_layers}-layer "
                    f"student: the student's depth must divide the teacher's")
  chosen = {"last": [student_layers], "last_two": [student_layers - 1, student_layers],
            "first_and_last": [1, student_layers], "all": list(range(1, student_layers + 1))}.get(variant)
  if chosen is None:
    raise UserError(f"unknown loss.layer_map {variant!r}: use one of {', '.join(LAYER_MAPS)}")
  if len(set(chosen)) != len(chosen) or min(chosen) < 1:
    raise UserError(f"loss.layer_map={variant} needs a student of at least 2 layers")
  step = teacher_layers // student_layers
  return [(m - 1, m * step - 1) for m in chosen]


def masked_mse(student_BxLxD, teacher_BxLxD, mask_BxL):
  """Mean squared error over the real tokens and the features."""
  mask = mask_BxL.astype(jnp.float32)[..., None]
  sq = (student_BxLxD.astype(jnp.float32) - teacher_BxLxD.astype(jnp.float32)) ** 2 * mask
  return jnp.sum(sq) / (jnp.maximum(jnp.sum(mask), 1.0) * teacher_BxLxD.shape[-1])


def mlm_mask(rng, ids_BxL, mask_BxL, special_ids, mask_id: int, vocab_size: int):
  """BERT's masking on device: 15% of real, non-special tokens are predicted; 80% of those become
  [MASK], 10% a random token, 10% stay. Returns (masked ids, float weights of predicted positions)."""
  k_choose, k_roll, k_random = jax.random.split(rng, 3)
  candidates = mask_BxL.astype(bool) & ~jnp.isin(ids_BxL, jnp.asarray(special_ids))
  chosen = jax.random.bernoulli(k_choose, 0.15, ids_BxL.shape) & candidates
  roll = jax.random.uniform(k_roll, ids_BxL.shape)
  ids = jnp.where(chosen & (roll < 0.8), mask_id, ids_BxL)
  ids = jnp.where(chosen & (roll >= 0.8) & (roll < 0.9), jax.random.randint(k_random, ids_BxL.shape, 0, vocab_size), ids)
  return ids, chosen.astype(jnp.float32)


def soft_label_kl(teacher_logits_BxLxV, student_logits_BxLxV, weights_BxL):
  """KL(teacher || student) of the masked-LM distributions, averaged over the predicted positions."""
  t = jax.nn.log_softmax(teacher_logits_BxLxV.astype(jnp.float32), axis=-1)
  s = jax.nn.log_softmax(student_logits_BxLxV.astype(jnp.float32), axis=-1)
  kl = jnp.sum(jnp.exp(t) * (t - s), axis=-1)
  return jnp.sum(kl * weights_BxL) / jnp.maximum(jnp.sum(weights_BxL), 1.0)


def attention_score_mse(teacher, student, mask_BxL):
  """MSE of the attention scores QK^T / sqrt(d_k) over heads and real (query, key) pairs (TinyBERT)."""
  def scores(layer):
    return jnp.einsum("bhqd,bhkd->bhqk", layer.q.astype(jnp.float32), layer.k.astype(jnp.float32)) / jnp.sqrt(
        jnp.float32(layer.q.shape[-1]))

  if teacher.q.shape[1] != student.q.shape[1]:
    raise UserError(f"attention-score MSE needs as many heads in the student ({student.q.shape[1]}) as in the "
                    f"teacher ({teacher.q.shape[1]})")
  real = mask_BxL.astype(jnp.float32)
  pairs = real[:, None, :, None] * real[:, None, None, :]
  sq = (scores(student) - scores(teacher)) ** 2 * pairs
  return jnp.sum(sq) / (jnp.maximum(jnp.sum(pairs), 1.0) * teacher.q.shape[1])


@dataclasses.dataclass(frozen=True)
class Objective:
  name: str
  pairs: tuple  # (student layer, teacher layer) the loss reads
  relations: tuple
  num_relation_heads: int
  query_chunk: int
  teacher_width: int
  student_width: int
  teacher_depth: int = 0
  student_depth: int = 0
  embedding_weight: float = 0.0  # > 0: the sentence-embedding term, times this weight
  embedding_loss: str = "mse"
  pooling: embeddings.Pooling = embeddings.Pooling()

  @property
  def uses_embeddings(self) -> bool:
    return self.embedding_weight > 0

  @property
  def teacher_layers_needed(self) -> int:
    return self.teacher_depth if self.uses_embeddings else max(t for _, t in self.pairs) + 1

  @property
  def student_layers_needed(self) -> int:
    return self.student_depth if self.uses_embeddings else max(s for s, _ in self.pairs) + 1

  def projection_shapes(self) -> dict:
    """Learned maps from the student's width to the teacher's, for the MSE objectives and the embeddings."""
    if self.student_width == self.teacher_width:
      return {}
    shape = (self.student_width, self.teacher_width)
    target = {"value_mse": "value", "hidden_mse": "hidden", "tinybert": "hidden"}.get(self.name)
    return {**({target: shape} if target else {}), **({"embedding": shape} if self.uses_embeddings else {})}

  @property
  def soft_labels(self) -> bool:
    return self.name == "mlm_kd"

  def init_projection(self, rng):
    shapes = self.projection_shapes()
    keys = jax.random.split(rng, max(len(shapes), 1))
    return {name: {"kernel": jax.random.normal(k, shape) * shape[0] ** -0.5} for k, (name, shape) in zip(keys, shapes.items())}

  def _project(self, projection, name, x_BxLxD):
    return x_BxLxD @ projection[name]["kernel"] if name in projection else x_BxLxD

  def __call__(self, teacher_layers, student_layers, mask_BxL, projection) -> dict:
    """Loss terms by name; the loss is their sum. `*_layers` are the encoders' LayerOutputs."""
    teacher_layers = jax.lax.stop_gradient(teacher_layers)
    terms = {} if self.name == "embedding" else self._relation_terms(teacher_layers, student_layers, mask_BxL, projection)
    if self.uses_embeddings:
      teacher = embeddings.sentence_embeddings(teacher_layers[-1].hidden, mask_BxL, self.pooling)
      kernel = projection["embedding"]["kernel"] if "embedding" in projection else None
      student = embeddings.sentence_embeddings(student_layers[-1].hidden, mask_BxL, self.pooling, kernel)
      terms[f"embedding_{self.embedding_loss}"] = self.embedding_weight * embeddings.embedding_loss(
          student, teacher, self.embedding_loss)
    return terms

  def _relation_terms(self, teacher_layers, student_layers, mask_BxL, projection) -> dict:
    if self.name in ("minilm", "layer_to_layer"):
      terms = {}
      for s, t in self.pairs:
        pair = losses.minilm_loss(teacher_layers[t], student_layers[s], mask_BxL, self.relations,
                                  self.num_relation_heads, self.query_chunk)
        suffix = "" if len(self.pairs) == 1 else f"@{s}"
        terms.update({f"{k}{suffix}": v for k, v in pair.items()})
      return terms
    (s, t), = self.pairs
    teacher, student = teacher_layers[t], student_layers[s]
    if self.name == "tinybert":
      return {"attention_mse": attention_score_mse(teacher, student, mask_BxL),
              "hidden_mse": masked_mse(self._project(projection, "hidden", student.hidden), teacher.hidden, mask_BxL)}
    attention = losses.minilm_loss(teacher, student, mask_BxL, ("qk",), self.num_relation_heads, self.query_chunk)
    if self.name == "value_mse":
      value = masked_mse(self._project(projection, "value", merge_heads(student.v)), merge_heads(teacher.v), mask_BxL)
      return {**attention, "value_mse": value}
    return {**attention, "hidden_mse": masked_mse(self._project(projection, "hidden", student.hidden), teacher.hidden, mask_BxL)}


def make_objective(loss_config, teacher_config, student_config, teacher_layer: int, student_layer: int,
                   pooling: embeddings.Pooling = embeddings.Pooling()) -> Objective:
  """The config's objective; `pooling` is the teacher's sentence-embedding pipeline."""
  name = loss_config.objective
  if name not in OBJECTIVES:
    raise UserError(f"unknown loss.objective {name!r}: use one of {', '.join(OBJECTIVES)}")
  weight = loss_config.embedding_weight
  if name == "embedding" and weight == 0:  # the term alone: its weight only scales the learning rate
    weight = 1.0
  if loss_config.embedding_loss not in EMBEDDING_LOSSES:
    raise UserError(f"unknown loss.embedding_loss {loss_config.embedding_loss!r}: use one of {', '.join(EMBEDDING_LOSSES)}")
  if weight > 0 and name == "mlm_kd":
    raise UserError("loss.embedding_weight > 0 with loss.objective=mlm_kd: the soft-label objective runs the masked-LM "
                    "heads, not the encoders' last layers; add the embedding term to a relation objective instead")
  if name == "layer_to_layer":
    pairs = layer_pairs(teacher_config.num_layers, student_config.num_layers, loss_config.layer_map)
  else:
    pairs = [(student_layer, teacher_layer)]
  return Objective(name=name, pairs=tuple(pairs), relations=losses.parse_relations(loss_config.relations),
                   num_relation_heads=loss_config.num_relation_heads, query_chunk=loss_config.query_chunk,
                   teacher_width=teacher_config.hidden_size, student_width=student_config.hidden_size,
                   teacher_depth=teacher_config.num_layers, student_depth=student_config.num_layers,
                   embedding_weight=weight, embedding_loss=loss_config.embedding_loss, pooling=pooling)
