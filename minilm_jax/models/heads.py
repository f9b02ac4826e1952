"""Task models: the encoder plus a head, laid out as transformers' BertForSequenceClassification
(pooler -> dropout -> `classifier`), BertForQuestionAnswering (`qa_outputs` on every token) and
BertForMaskedLM (`Seq2SeqLM`: UniLM's sequence-to-sequence fine-tuning)."""

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from minilm_jax.errors import UserError
from minilm_jax.models import layout
from minilm_jax.models.encoder import ACTIVATIONS, Encoder, EncoderConfig, KVCache, abstract_params, dummy_ids

CLASSIFICATION, SPAN, SEQ2SEQ = "classification", "span", "seq2seq"


class LMHead(nn.Module):
  """BERT's masked-LM head (transformers' `cls.predictions`): dense -> activation -> LayerNorm ->
  scores against the tied word embeddings + a bias. Logits [..., vocab], float32. Task models
  share their scope with it (`nn.share_scope`), so its parameters sit beside "encoder" under
  transformers' names; distillation keeps a student's under "mlm_head"."""

  config: EncoderConfig

  def setup(self):
    c = self.config
    self.transform = nn.Dense(
      c.hidden_size, param_dtype=jnp.float32, kernel_init=nn.initializers.normal(c.initializer_range)
    )
    self.transform_LayerNorm = nn.LayerNorm(epsilon=c.layer_norm_eps, use_fast_variance=False)
    self.bias = self.param("bias", nn.initializers.zeros, (c.vocab_size,))

  def __call__(self, hidden, word_embeddings):
    h = ACTIVATIONS[self.config.hidden_act](self.transform(hidden.astype(jnp.float32)))
    return (self.transform_LayerNorm(h) @ word_embeddings.T + self.bias).astype(jnp.float32)


class MaskedLM(nn.Module):
  """The encoder with BERT's masked-LM head: logits [batch, length, vocab], float32."""

  config: EncoderConfig

  def setup(self):
    self.encoder = Encoder(self.config)
    self.head = LMHead(self.config)
    nn.share_scope(self, self.head)

  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    out = self.encoder(input_ids, attention_mask, token_type_ids, deterministic)
    return self.head(out.last_hidden_state, layout.word_embeddings(self.encoder.variables["params"]))


class SequenceClassifier(nn.Module):
  """Logits [batch, num_labels] (num_labels 1: a regression score) from the pooled [CLS] vector."""

  config: EncoderConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids, deterministic)
    x = nn.Dropout(self.config.hidden_dropout)(out.pooler_output, deterministic=deterministic)
    head = nn.Dense(
      self.num_labels,
      param_dtype=jnp.float32,
      kernel_init=nn.initializers.normal(self.config.initializer_range),
      name="classifier",
    )
    return head(x).astype(jnp.float32)


class SpanExtractor(nn.Module):
  """Start and end logits [batch, length] of an answer span."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids, deterministic)
    head = nn.Dense(
      2, param_dtype=jnp.float32, kernel_init=nn.initializers.normal(self.config.initializer_range), name="qa_outputs"
    )
    logits = head(out.last_hidden_state).astype(jnp.float32)
    return logits[..., 0], logits[..., 1]


def seq2seq_mask(attention_mask_BxL, source_length: int):
  """UniLM's sequence-to-sequence self-attention mask [B, L, L] over `source_length` source
  positions followed by the target's: a source token sees every real source token and no target
  token; a target token sees every real source token and the real target tokens up to itself."""
  positions = jnp.arange(attention_mask_BxL.shape[1])
  key_in_target = positions >= source_length
  sees = ~key_in_target[None, :] | (key_in_target[:, None] & (positions[None, :] <= positions[:, None]))
  return attention_mask_BxL.astype(bool)[:, None, :] & sees[None]


def real_positions(attention_mask_BxL, config: EncoderConfig):
  """Position ids that number the real tokens consecutively, skipping the padding between the
  source and target blocks (padding itself gets the model type's padding position)."""
  real = attention_mask_BxL.astype(bool)
  offset = config.position_offset
  return jnp.where(real, jnp.cumsum(real, axis=1) - 1 + offset, max(offset - 1, 0))


class Seq2SeqLM(nn.Module):
  """UniLM's sequence-to-sequence model: one encoder under `seq2seq_mask`, and the masked-LM head
  (dense -> activation -> LayerNorm -> scores against the tied word embeddings + a bias).

  Inputs are a source block of L - `target_length` positions ([CLS] source [SEP], padded) followed
  by a target block of `target_length` (t_1 .. t_n, padded), segment 0 and 1. It predicts every
  target token in one pass, each from the position before it: t_1 from the source's last token
  ([SEP]), t_(i+1) from t_i, and [SEP] (the end) from t_n. `__call__` returns those
  `target_length` + 1 predictions' logits [B, target_length + 1, vocab], float32.
  `encode_source` and `decode_step` are the same computation one token at a time, for decoding.

  With `masked_targets`, UniLM's form (Dong et al. 2019, section 2.4): the target block holds t_1 ..
  t_n [SEP] with some tokens replaced by [MASK] (`tasks.seq2seq.mask_targets`), and each target
  position predicts its own token from its own output; `__call__` returns [B, target_length,
  vocab]. Decoding (`decode_masked`) appends a [MASK] after the tokens chosen so far and predicts
  it, then writes the chosen token where the [MASK] was: two positions a step, as UniLM's decoder.
  The encoder pass under the same mask is shared by both forms; they differ in which positions'
  outputs predict which tokens, and in what the target block is fed.
  """

  config: EncoderConfig
  target_length: int
  masked_targets: bool = False

  def setup(self):
    self.encoder = Encoder(self.config)
    self.head = LMHead(self.config)
    nn.share_scope(self, self.head)

  def _logits(self, hidden):
    return self.head(hidden, layout.word_embeddings(self.encoder.variables["params"]))

  def _target_segment(self, like):
    """Segment 1 for target tokens; a model with one segment embedding (RoBERTa) uses 0."""
    return jnp.full_like(like, 1 if self.config.type_vocab_size > 1 else 0)

  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    source_length = input_ids.shape[1] - self.target_length
    out = self.encoder(
      input_ids,
      seq2seq_mask(attention_mask, source_length),
      token_type_ids,
      deterministic,
      position_ids_BxL=real_positions(attention_mask, self.config),
    )
    if self.masked_targets:  # each target position's own prediction
      return self._logits(out.last_hidden_state[:, source_length:])
    source_last = attention_mask[:, :source_length].sum(axis=1) - 1
    slots = jnp.concatenate(
      [
        source_last[:, None],
        source_length + jnp.broadcast_to(jnp.arange(self.target_length), (input_ids.shape[0], self.target_length)),
      ],
      axis=1,
    )
    hidden = jnp.take_along_axis(out.last_hidden_state, slots[:, :, None], axis=1)
    return self._logits(hidden)

  def encode_source(self, source_ids, source_mask, source_types):
    """(logits [B, vocab] of the first target token, every layer's keys and values [B, heads,
    source + target length, head_dim]: the source's, then room for the target's)."""
    out = self.encoder(source_ids, source_mask, source_types, position_ids_BxL=real_positions(source_mask, self.config))
    room = ((0, 0), (0, 0), (0, self.target_length), (0, 0))
    keys = tuple(jnp.pad(layer.k, room) for layer in out.layers)
    values = tuple(jnp.pad(layer.v, room) for layer in out.layers)
    source_last = source_mask.sum(axis=1) - 1
    hidden = jnp.take_along_axis(out.last_hidden_state, source_last[:, None, None], axis=1)[:, 0]
    return self._logits(hidden), keys, values

  def decode_step(self, tokens_N, keys, values, source_mask, step):
    """Feeds target token `step` (0-based) of each sequence: (logits [N, vocab] of the token after
    it, the keys and values with its own written in)."""
    return self._feed(tokens_N[:, None], keys, values, source_mask, step)

  def decode_masked(self, tokens_N, keys, values, source_mask, step, mask_id: int):
    """UniLM's decoding step (`masked_targets`): writes the chosen target token `step` where its
    [MASK] was and a new [MASK] at `step` + 1: (logits [N, vocab] of that [MASK], the caches).
    `tokens_N` None: the first step, a [MASK] at target position 0 alone."""
    if tokens_N is None:
      masks = jnp.full((source_mask.shape[0], 1), mask_id, jnp.int32)
      return self._feed(masks, keys, values, source_mask, 0)
    fed = jnp.stack([tokens_N, jnp.full_like(tokens_N, mask_id)], axis=1)
    return self._feed(fed, keys, values, source_mask, step)

  def _feed(self, tokens_NxQ, keys, values, source_mask, first):
    """Feeds Q target tokens at target positions `first` .. `first` + Q - 1, each attending to the
    real source, the target before it and itself: (logits [N, vocab] of the last, the caches with
    the tokens' keys and values written in)."""
    source_length, num_new = source_mask.shape[1], tokens_NxQ.shape[1]
    at = first + jnp.arange(num_new)  # the new tokens' target positions
    target_keys = jnp.arange(self.target_length)[None, :] <= at[:, None]  # [Q, target_length]
    key_mask = jnp.concatenate(
      [
        jnp.broadcast_to(source_mask.astype(bool)[:, None, :], (source_mask.shape[0], num_new, source_length)),
        jnp.broadcast_to(target_keys[None], (source_mask.shape[0], num_new, self.target_length)),
      ],
      axis=2,
    )
    positions = source_mask.sum(axis=1, keepdims=True) + at[None, :] + self.config.position_offset
    cache = KVCache(keys=keys, values=values, index=source_length + first)
    out = self.encoder(tokens_NxQ, key_mask, self._target_segment(tokens_NxQ), position_ids_BxL=positions, cache=cache)
    keys, values = tuple(layer.k for layer in out.layers), tuple(layer.v for layer in out.layers)
    return self._logits(out.last_hidden_state[:, -1]), keys, values


# The masked-LM head's parameters (decoder weights tied to the word embeddings) as transformers
# names them: BERT's `cls.predictions` and RoBERTa's `lm_head`. (our name, theirs, how: "linear" is
# a kernel stored [in, out] here and [out, in] in PyTorch.)
MLM_WEIGHTS = {
  "bert": (
    ("transform/kernel", "cls.predictions.transform.dense.weight", "linear"),
    ("transform/bias", "cls.predictions.transform.dense.bias", "copy"),
    ("transform_LayerNorm/scale", "cls.predictions.transform.LayerNorm.weight", "copy"),
    ("transform_LayerNorm/bias", "cls.predictions.transform.LayerNorm.bias", "copy"),
    ("bias", "cls.predictions.bias", "copy"),
  ),
  "roberta": (
    ("transform/kernel", "lm_head.dense.weight", "linear"),
    ("transform/bias", "lm_head.dense.bias", "copy"),
    ("transform_LayerNorm/scale", "lm_head.layer_norm.weight", "copy"),
    ("transform_LayerNorm/bias", "lm_head.layer_norm.bias", "copy"),
    ("bias", "lm_head.bias", "copy"),
  ),
}


def _classification_config(head: dict) -> dict:
  """transformers' config.json fields of a classifier: its labels, and regression for one output."""
  labels = head.get("labels") or [f"LABEL_{i}" for i in range(head["num_labels"])]
  return {
    "num_labels": head["num_labels"],
    "id2label": dict(enumerate(labels)),
    "label2id": {l: i for i, l in enumerate(labels)},
    "problem_type": "regression" if head["num_labels"] == 1 else "single_label_classification",
  }


def _check_classifier(params, head: dict):
  outputs = params["classifier"]["kernel"].shape[-1]
  if outputs != head["num_labels"] or len(head.get("labels") or [None] * outputs) != outputs:
    raise UserError(
      f"the classifier has {outputs} outputs but the head names {head['num_labels']} labels: "
      f"the checkpoint does not belong to this task's label set"
    )


@dataclasses.dataclass(frozen=True)
class HeadKind:
  """A kind of task head, declared once: its Flax module, the transformers class and tensor names it
  exports as, and what a run of it does differently from the others. A head description (a run's
  record) is a dict {"kind": <a key of HEADS>, ...the module's fields}."""

  module: Callable[[EncoderConfig, dict], nn.Module]
  hf_class: str  # the transformers class an export loads as, after the architecture's name ("Bert...")
  # By the architecture's `head_layout`: (our path in the task model, transformers' name, "linear" |
  # "copy") of the head's parameters (an encoder parameter named here is exported as the head's
  # alone); a layout not here does not export this head.
  hf_weights: dict
  hf_config: Callable[[dict], dict] = lambda head: {}  # its own config.json fields
  label_dtype: Callable[[dict], Any] = lambda head: jnp.int32  # of the training labels
  check_params: Callable[[Any, dict], None] = lambda params, head: None  # a one-line error if they do not fit
  # UniLM's sequence-to-sequence model, BERT's masked LM over source + target: it starts from the
  # pre-trained masked-LM head, may repeat a position table too short for source + target, decodes
  # with beam search, is exported with its input layout, and its analytic FLOPs are not counted.
  generates: bool = False
  positions: Callable[[dict], int] = lambda head: 0  # extra positions its model's inputs hold


def _linear(ours: str, theirs: str) -> tuple:
  return ((f"{ours}/kernel", f"{theirs}.weight", "linear"), (f"{ours}/bias", f"{theirs}.bias", "copy"))


# Our classifier is BERT's: the pooler's dense map and tanh on the first token, then a linear map.
# RoBERTa's, XLM-R's and MPNet's classification heads hold the same two maps themselves
# ("classifier.dense", "classifier.out_proj"); DeBERTa's pools by its ContextPooler, the same map
# with `pooler_hidden_act` tanh (`HEAD_LAYOUT_CONFIG`).
_SPAN_WEIGHTS = _linear("qa_outputs", "qa_outputs")
HEAD_LAYOUT_CONFIG = {"deberta": {"pooler_hidden_act": "tanh"}}

HEADS = {
  CLASSIFICATION: HeadKind(
    lambda config, head: SequenceClassifier(config, head["num_labels"]),
    "ForSequenceClassification",
    {
      "bert": _linear("classifier", "classifier"),
      "roberta": (*_linear("encoder/pooler", "classifier.dense"), *_linear("classifier", "classifier.out_proj")),
      "deberta": (*_linear("encoder/pooler", "pooler.dense"), *_linear("classifier", "classifier")),
    },
    hf_config=_classification_config,
    check_params=_check_classifier,
    label_dtype=lambda head: jnp.float32 if head["num_labels"] == 1 else jnp.int32,  # one output: regression
  ),
  SPAN: HeadKind(
    lambda config, head: SpanExtractor(config),
    "ForQuestionAnswering",
    {"bert": _SPAN_WEIGHTS, "roberta": _SPAN_WEIGHTS, "deberta": _SPAN_WEIGHTS},
  ),
  SEQ2SEQ: HeadKind(
    lambda config, head: Seq2SeqLM(config, head["target_length"], masked_targets(head)),
    "ForMaskedLM",
    {"bert": MLM_WEIGHTS["bert"]},
    generates=True,
    positions=lambda head: head["target_length"],
  ),
}


def masked_targets(head: dict) -> bool:
  """A sequence-to-sequence head trained in UniLM's masked form (predicting [MASK]ed target tokens)
  rather than in one pass; the field is absent from the other heads."""
  return bool(head.get("masked_targets", False))


def head_kind(head: dict) -> HeadKind:
  if head.get("kind") not in HEADS:
    raise UserError(f"unknown task head {head.get('kind')!r}: a run's head is one of {', '.join(HEADS)}")
  return HEADS[head["kind"]]


def task_model(config: EncoderConfig, head: dict) -> nn.Module:
  """The model for a head description, e.g. {"kind": "classification", "num_labels": n}, {"kind":
  "span"} or {"kind": "seq2seq", "target_length": n}."""
  return head_kind(head).module(config, head)


def init_task_params(config: EncoderConfig, head: dict, rng):
  """Random parameters of the task model for `head`."""
  ids = dummy_ids(8 + head_kind(head).positions(head))  # a seq2seq model's source and target blocks
  return task_model(config, head).init(rng, ids, jnp.ones_like(ids))["params"]


def abstract_model_params(config: EncoderConfig, head: dict | None = None):
  """Parameter shapes of the encoder alone (head None) or of a task model: a fresh tree for each
  caller, from one trace per config and head in a process (as `abstract_params`)."""
  if head is None:
    return abstract_params(config)
  return jax.tree.map(lambda leaf: leaf, _traced_task_params(config, json.dumps(head, sort_keys=True)))


@functools.lru_cache(maxsize=32)
def _traced_task_params(config: EncoderConfig, head_json: str):
  return jax.eval_shape(lambda: init_task_params(config, json.loads(head_json), jax.random.key(0)))


# A task model's encoder inputs, in the order its `__call__` takes them.
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def apply_model(model, params, batch, deterministic=True, rngs=None):
  """A task model's outputs on a batch's encoder inputs."""
  return model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=deterministic, rngs=rngs)
