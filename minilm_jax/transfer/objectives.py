"""Distillation objectives: a registry of pure functions, MiniLM (the default) and the baselines the
papers compare it with.

An objective is a function `terms = fn(objective, teacher, student, batch, projection)` of the two
models' `Outputs` (their layers' LayerOutputs, and masked-LM logits when it asks for them), the
batch (`attention_mask`, and `mlm_weights` on BERT-masked inputs) and the student's learned maps
to the teacher's width, returning its loss terms by name (the loss is their sum). `register`
adds it under a name, with what it needs: which maps (`projections`), the models' masked-LM heads
on BERT-masked inputs (`mlm_head`), every layer of both models (`whole_models`) instead of the
configured pair, or several layer pairs (`layer_pairs`). The trainer reads only those
declarations (`Objective`): it has no objective-specific code.

- "minilm": relation KLs of one teacher layer and one student layer (`relations.minilm_loss`).
- "layer_to_layer": the same relation KLs at several layer pairs of TinyBERT's uniform mapping
  (student layer m <- teacher layer m * L / M), transferred to the student's last layer, last two,
  first and last, or all layers (MiniLM supplementary table 8).
- "value_mse" / "hidden_mse": attention-distribution KL plus MSE against the teacher's last-layer
  values / hidden states (MiniLM table 6, supplementary table 7), through a learned linear map when
  the widths differ.
- "tinybert": ETD's last-layer objective: MSE of attention scores plus MSE of hidden states
  through a learned map W_h.
- "tinybert_layerwise": TinyBERT's general distillation (Jiao et al., 2019, equations 7-9; MiniLM
  table 1 and table 3's TinyBERT rows): the embedding layer's MSE through a learned W_e, then at
  every student layer m and teacher layer m * L / M (the uniform mapping) the attention-score MSE
  and the hidden-state MSE through one learned W_h shared by all layers, summed. The paper writes
  W_e and W_h apart (TinyBERT's released code uses one map for both): we follow the paper. MSEs are
  over real tokens (and real query-key pairs), not padding.
- "hidden_states": the hidden-state MSE alone (no attention term), at the layer pairs of
  `loss.layer_map` (the uniform mapping, like "layer_to_layer"), through one learned W_h when the
  widths differ: every layer's token states, where the embedding term matches only their pooled mean.
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
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import jax
import jax.numpy as jnp
import ml_collections

from minilm_jax.errors import UserError
from minilm_jax.models import embeddings, layout
from minilm_jax.models.attention import merge_heads
from minilm_jax.models.encoder import Encoder, EncoderOutput
from minilm_jax.models.heads import LMHead
from minilm_jax.transfer import relations

LAYER_MAPS = ("last", "last_two", "first_and_last", "all")


def layer_pairs(teacher_layers: int, student_layers: int, variant: str) -> list:
  """(student layer, teacher layer) pairs, 0-based, of the uniform mapping restricted to `variant`."""
  if teacher_layers % student_layers:
    raise UserError(
      f"no uniform layer mapping from a {teacher_layers}-layer teacher to a {student_layers}-layer "
      f"student: the student's depth must divide the teacher's"
    )
  chosen = {
    "last": [student_layers],
    "last_two": [student_layers - 1, student_layers],
    "first_and_last": [1, student_layers],
    "all": list(range(1, student_layers + 1)),
  }.get(variant)
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


class Masking(NamedTuple):
  """What BERT's masking of the inputs reads of a tokenizer: the special tokens' ids (never masked)
  and the [MASK] token's id."""

  special_ids: tuple = ()
  mask_id: int = 0

  @classmethod
  def of(cls, tokenizer) -> "Masking":
    return cls(tuple(tokenizer.all_special_ids), tokenizer.mask_token_id)


def mlm_mask(rng, ids_BxL, mask_BxL, masking: Masking, vocab_size: int):
  """BERT's masking on device, `masking` the tokenizer's (`Masking`): 15% of real,
  non-special tokens are predicted; 80% of those become [MASK], 10% a random token, 10% stay.
  Returns (masked ids, float weights of predicted positions)."""
  special_ids, mask_id = masking
  k_choose, k_roll, k_random = jax.random.split(rng, 3)
  candidates = mask_BxL.astype(bool) & ~jnp.isin(ids_BxL, jnp.asarray(special_ids))
  chosen = jax.random.bernoulli(k_choose, 0.15, ids_BxL.shape) & candidates
  roll = jax.random.uniform(k_roll, ids_BxL.shape)
  ids = jnp.where(chosen & (roll < 0.8), mask_id, ids_BxL)
  ids = jnp.where(
    chosen & (roll >= 0.8) & (roll < 0.9), jax.random.randint(k_random, ids_BxL.shape, 0, vocab_size), ids
  )
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
      jnp.float32(layer.q.shape[-1])
    )

  if teacher.q.shape[1] != student.q.shape[1]:
    raise UserError(
      f"attention-score MSE needs as many heads in the student ({student.q.shape[1]}) as in the "
      f"teacher ({teacher.q.shape[1]})"
    )
  real = mask_BxL.astype(jnp.float32)
  pairs = real[:, None, :, None] * real[:, None, None, :]
  sq = (scores(student) - scores(teacher)) ** 2 * pairs
  return jnp.sum(sq) / (jnp.maximum(jnp.sum(pairs), 1.0) * teacher.q.shape[1])


class Outputs(NamedTuple):
  """What an objective reads of a model: its layers' `LayerOutput`s (as many as the objective needs)
  and, for objectives that declare `mlm_head`, its masked-LM logits [B, L, vocab]."""

  layers: tuple
  mlm_logits: Any | None = None
  embeddings: Any | None = None  # the embedding layer's output [B, L, D]: the input of layer 0
  # The last layer's output as the model hands it on (`EncoderOutput.last_hidden_state`: a pre-norm
  # model's final norm applied), what a sentence embedding pools.
  last_hidden_state: Any | None = None


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a registered objective needs besides both models' layers at its layer pairs."""

  projections: tuple = ()  # learned maps student width -> teacher width, by name (when the widths differ)
  mlm_head: bool = False  # both models' masked-LM heads, on BERT-masked inputs (`batch["mlm_weights"]`)
  whole_models: bool = False  # every layer of both models, not just the layer pairs
  # (loss config, teacher depth, student depth) -> the (student, teacher) layer pairs; None: the configured pair
  layer_pairs: Callable | None = None
  embedding_term: bool = False  # the sentence-embedding term is the objective (weight 1 unless set)


DISTILLATION_OBJECTIVES: dict = {}


def register(name: str, **needs):
  """Decorator: adds `fn(objective, teacher, student, batch, projection) -> terms` as `loss.objective=name`."""

  def add(fn):
    DISTILLATION_OBJECTIVES[name] = (fn, Needs(**needs))
    return fn

  return add


def _pair(objective):
  ((s, t),) = objective.pairs
  return s, t


def _hidden_mse(objective, projection, teacher_layer, student_layer, mask_BxL):
  """MSE of a student layer's hidden states (through W_h when the widths differ) against a teacher layer's."""
  return masked_mse(objective.project(projection, "hidden", student_layer.hidden), teacher_layer.hidden, mask_BxL)


def _configured_pairs(loss_config, teacher_layers: int, student_layers: int) -> list:
  return layer_pairs(teacher_layers, student_layers, loss_config.layer_map)


@register("layer_to_layer", layer_pairs=_configured_pairs)
@register("minilm")
def relation_kls(objective, teacher, student, batch, projection) -> dict:
  """The relation KLs at every layer pair (MiniLM: one pair; layer-to-layer: `@<student layer>` each)."""
  terms = {}
  for s, t in objective.pairs:
    pair = relations.minilm_loss(
      teacher.layers[t],
      student.layers[s],
      batch["attention_mask"],
      objective.relations,
      objective.num_relation_heads,
      objective.query_chunk,
    )
    suffix = "" if len(objective.pairs) == 1 else f"@{s}"
    terms.update({f"{k}{suffix}": v for k, v in pair.items()})
  return terms


def _attention_kl(objective, teacher_layer, student_layer, mask_BxL) -> dict:
  return relations.minilm_loss(
    teacher_layer, student_layer, mask_BxL, ("qk",), objective.num_relation_heads, objective.query_chunk
  )


@register("value_mse", projections=("value",))
def value_mse(objective, teacher, student, batch, projection) -> dict:
  s, t = _pair(objective)
  mask = batch["attention_mask"]
  value = masked_mse(
    objective.project(projection, "value", merge_heads(student.layers[s].v)), merge_heads(teacher.layers[t].v), mask
  )
  return {**_attention_kl(objective, teacher.layers[t], student.layers[s], mask), "value_mse": value}


@register("hidden_mse", projections=("hidden",))
def hidden_mse(objective, teacher, student, batch, projection) -> dict:
  s, t = _pair(objective)
  mask = batch["attention_mask"]
  hidden = _hidden_mse(objective, projection, teacher.layers[t], student.layers[s], mask)
  return {**_attention_kl(objective, teacher.layers[t], student.layers[s], mask), "hidden_mse": hidden}


@register("tinybert", projections=("hidden",))
def tinybert(objective, teacher, student, batch, projection) -> dict:
  s, t = _pair(objective)
  mask = batch["attention_mask"]
  return {
    "attention_mse": attention_score_mse(teacher.layers[t], student.layers[s], mask),
    "hidden_mse": _hidden_mse(objective, projection, teacher.layers[t], student.layers[s], mask),
  }


@register(
  "tinybert_layerwise",
  projections=("embeddings", "hidden"),
  layer_pairs=lambda c, t, s: layer_pairs(t, s, "all"),
)
def tinybert_layerwise(objective, teacher, student, batch, projection) -> dict:
  mask = batch["attention_mask"]
  terms = {
    "embeddings_mse": masked_mse(
      objective.project(projection, "embeddings", student.embeddings), teacher.embeddings, mask
    )
  }
  for s, t in objective.pairs:
    terms[f"attention_mse@{s}"] = attention_score_mse(teacher.layers[t], student.layers[s], mask)
    terms[f"hidden_mse@{s}"] = _hidden_mse(objective, projection, teacher.layers[t], student.layers[s], mask)
  return terms


@register("hidden_states", projections=("hidden",), layer_pairs=_configured_pairs)
def hidden_states(objective, teacher, student, batch, projection) -> dict:
  mask = batch["attention_mask"]
  terms = {}
  for s, t in objective.pairs:
    suffix = "" if len(objective.pairs) == 1 else f"@{s}"
    terms[f"hidden_mse{suffix}"] = _hidden_mse(objective, projection, teacher.layers[t], student.layers[s], mask)
  return terms


@register("mlm_kd", mlm_head=True, whole_models=True)
def mlm_kd(objective, teacher, student, batch, projection) -> dict:
  return {"mlm_kd": soft_label_kl(teacher.mlm_logits, student.mlm_logits, batch["mlm_weights"])}


@register("embedding", whole_models=True, embedding_term=True)
def embedding(objective, teacher, student, batch, projection) -> dict:
  return {}  # the sentence-embedding term, which `Objective` adds to any objective, is the whole loss


@dataclasses.dataclass(frozen=True)
class Objective:
  """A registered objective with its settings: the loss terms of the models' `Outputs`, plus what the
  trainer must run and learn for it."""

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
  masking: Masking = Masking()  # the tokenizer's, for objectives on BERT-masked inputs

  @property
  def needs(self) -> Needs:
    return DISTILLATION_OBJECTIVES[self.name][1]

  @property
  def whole_models(self) -> bool:
    return self.needs.whole_models or self.embedding_weight > 0

  @property
  def teacher_layers_needed(self) -> int:
    return self.teacher_depth if self.whole_models else max(t for _, t in self.pairs) + 1

  @property
  def student_layers_needed(self) -> int:
    return self.student_depth if self.whole_models else max(s for s, _ in self.pairs) + 1

  def projection_shapes(self) -> dict:
    """Learned maps from the student's width to the teacher's, for the MSE objectives and the embeddings."""
    if self.student_width == self.teacher_width:
      return {}
    names = self.needs.projections + (("embedding",) if self.embedding_weight > 0 else ())
    return {name: (self.student_width, self.teacher_width) for name in names}

  def init_learned(self, rng, student_config) -> dict:
    """What the student learns besides its encoder, by parameter-tree key: "projection" (the maps to
    the teacher's width) and "mlm_head" (a masked-LM head tied to its word embeddings)."""
    learned = {}
    shapes = self.projection_shapes()
    if shapes:
      keys = jax.random.split(jax.random.fold_in(rng, 1), len(shapes))
      learned["projection"] = {
        name: {"kernel": jax.random.normal(k, shape) * shape[0] ** -0.5}
        for k, (name, shape) in zip(keys, shapes.items())
      }
    if self.needs.mlm_head:
      hidden = jnp.zeros((1, student_config.hidden_size))
      embedding = jnp.zeros((student_config.vocab_size, student_config.hidden_size))
      learned["mlm_head"] = LMHead(student_config).init(jax.random.fold_in(rng, 2), hidden, embedding)["params"]
    return learned

  def project(self, projection, name, x_BxLxD):
    return x_BxLxD @ projection[name]["kernel"] if name in projection else x_BxLxD

  def inputs(self, rng, batch: dict, vocab_size: int) -> dict:
    """The batch both models read: BERT-masked (with `mlm_weights`) for objectives on masked-LM heads."""
    if not self.needs.mlm_head:
      return batch
    ids, weights = mlm_mask(rng, batch["input_ids"], batch["attention_mask"], self.masking, vocab_size)
    return {**batch, "input_ids": ids, "mlm_weights": weights}

  def outputs(self, model: Encoder, params, batch: dict, num_layers: int, rngs=None) -> Outputs:
    """What this objective reads of `model` (the teacher or the student) on `batch`. `params` are the
    encoder's, with the masked-LM head's under "mlm_head" when the objective runs it; with `rngs`
    (dropout's) the model runs in training mode."""
    out = cast(  # flax types apply's result as (output, variables) | output
      EncoderOutput,
      model.apply(
        {"params": params},
        batch["input_ids"],
        batch["attention_mask"],
        batch["token_type_ids"],
        deterministic=rngs is None,
        rngs=rngs,
        num_layers=num_layers,
      ),
    )
    logits = None
    if self.needs.mlm_head:
      logits = LMHead(model.config).apply(
        {"params": params["mlm_head"]}, out.last_hidden_state, layout.word_embeddings(params)
      )
    return Outputs(out.layers, logits, out.embeddings, out.last_hidden_state)

  def student_terms(self, student: Encoder, params, teacher: Outputs, batch: dict, rngs=None) -> dict:
    """The loss terms of student `params` (its encoder's, plus what it learns besides) against the
    teacher's outputs: what the train step differentiates."""
    student_out = self.outputs(student, params, batch, self.student_layers_needed, rngs)
    return self(teacher, student_out, batch, params.get("projection", {}))

  def __call__(self, teacher: Outputs, student: Outputs, batch: dict, projection) -> dict:
    """Loss terms by name; the loss is their sum."""
    teacher = jax.lax.stop_gradient(teacher)
    terms = DISTILLATION_OBJECTIVES[self.name][0](self, teacher, student, batch, projection)
    if self.embedding_weight > 0:
      mask = batch["attention_mask"]
      t_embedding = embeddings.sentence_embeddings(teacher.last_hidden_state, mask, self.pooling)
      kernel = projection["embedding"]["kernel"] if "embedding" in projection else None
      s_embedding = embeddings.sentence_embeddings(student.last_hidden_state, mask, self.pooling, kernel)
      distance = embeddings.EMBEDDING_LOSSES[self.embedding_loss]
      terms[f"embedding_{self.embedding_loss}"] = self.embedding_weight * distance(s_embedding, t_embedding)
    return terms


def loss_config() -> ml_collections.ConfigDict:
  """The `loss` block of a distillation config (and of a fine-tuning run's layer objective,
  `distill.layers`): the objective and its settings, with their defaults."""
  c = ml_collections.ConfigDict()
  # "minilm", a baseline ("layer_to_layer", "value_mse", "hidden_mse", "tinybert", "tinybert_layerwise",
  # "mlm_kd"), "hidden_states", or "embedding" (the registry above)
  c.objective = "minilm"
  # The sentence-embedding term (objective "embedding" alone, or added to another objective with a
  # weight > 0): "mse" (squared distance) or "cosine" (1 - cos) between the two models' sentence
  # embeddings, pooled and normalised as the teacher's sentence-transformers config says.
  c.embedding_weight = 0.0
  c.embedding_loss = "mse"
  # layer_to_layer and hidden_states: "last", "last_two", "first_and_last" or "all" student layers
  c.layer_map = "last"
  c.relations = "minilm"  # "minilm" (qk, vv), "minilmv2" (qq, kk, vv), or pairs like "qk,vv"
  c.num_relation_heads = 12
  # > 0: compute relations this many query rows at a time, so the [batch, A_r, L, L] relation
  # tensors never live whole (same loss and gradient; for long sequences on memory-bound devices).
  c.query_chunk = 0
  return c


def uses_embedding_term(loss_config) -> bool:
  """Whether the configured objective includes the sentence-embedding term (and so needs a teacher
  whose pooling it can reproduce)."""
  registered = DISTILLATION_OBJECTIVES.get(loss_config.objective)
  return loss_config.embedding_weight > 0 or (registered is not None and registered[1].embedding_term)


def make_objective(
  loss_config,
  teacher_config,
  student_config,
  teacher_layer: int,
  student_layer: int,
  pooling: embeddings.Pooling = embeddings.Pooling(),
  masking: Masking = Masking(),
) -> Objective:
  """The config's objective; `pooling` is the teacher's sentence-embedding pipeline, `masking` the
  tokenizer's for objectives on BERT-masked inputs."""
  name = loss_config.objective
  if name not in DISTILLATION_OBJECTIVES:
    raise UserError(f"unknown loss.objective {name!r}: use one of {', '.join(DISTILLATION_OBJECTIVES)}")
  needs = DISTILLATION_OBJECTIVES[name][1]
  weight = loss_config.embedding_weight
  if needs.embedding_term and weight == 0:  # the term alone: its weight only scales the learning rate
    weight = 1.0
  if loss_config.embedding_loss not in embeddings.EMBEDDING_LOSSES:
    raise UserError(
      f"unknown loss.embedding_loss {loss_config.embedding_loss!r}: use one of {', '.join(embeddings.EMBEDDING_LOSSES)}"
    )
  if weight > 0 and needs.mlm_head:
    raise UserError(
      f"loss.embedding_weight > 0 with loss.objective={name}: the soft-label objective runs the masked-LM "
      "heads, not the encoders' last layers; add the embedding term to a relation objective instead"
    )
  if needs.layer_pairs:
    pairs = needs.layer_pairs(loss_config, teacher_config.num_layers, student_config.num_layers)
  else:
    pairs = [(student_layer, teacher_layer)]
  return Objective(
    name=name,
    pairs=tuple(pairs),
    relations=relations.parse_relations(loss_config.relations),
    num_relation_heads=loss_config.num_relation_heads,
    query_chunk=loss_config.query_chunk,
    teacher_width=teacher_config.hidden_size,
    student_width=student_config.hidden_size,
    teacher_depth=teacher_config.num_layers,
    student_depth=student_config.num_layers,
    embedding_weight=weight,
    embedding_loss=loss_config.embedding_loss,
    pooling=pooling,
    masking=masking if needs.mlm_head else Masking(),
  )
