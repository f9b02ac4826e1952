"""Multi-task models of the thesis: a body shared by the tasks plus one head per task.

Students (MKD's layout, section 4.2; a single-task student is the case of one task): heads
Dense + ReLU -> Dense logits on the BiLSTM and bi-attentive LSTM bodies of `lstm`, or on the
3-layer Transformer of section 4.1.3 (`EncoderBody`: the first layers of a teacher, the `[CLS]`
vectors of every layer averaged). The multi-task refined teacher (section 4.1.1): BERT's pooled
`[CLS]` (`EncoderBody` with the "pooler" readout) with one linear output layer per task.
"""

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp

from minilm_jax.errors import UserError
from minilm_jax.models.encoder import Encoder, EncoderConfig
from minilm_jax.models.lstm import BiAttentiveBody, BiLSTMBody


class EncoderBody(nn.Module):
  """An encoder on the joint `[CLS] a [SEP] b [SEP]` inputs, read out as the Transformer student's
  `[CLS]` of every layer averaged ("mean_cls"), or as BERT's pooled `[CLS]` after dropout ("pooler",
  the refined teacher, as `SequenceClassifier`)."""

  config: EncoderConfig
  readout: str = "mean_cls"

  @nn.compact
  def __call__(self, batch, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(
      batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], deterministic
    )
    if self.readout == "pooler":
      return nn.Dropout(self.config.hidden_dropout)(out.pooler_output, deterministic=deterministic).astype(jnp.float32)
    return jnp.mean(jnp.stack([layer.hidden[:, 0] for layer in out.layers]), axis=0).astype(jnp.float32)


class TaskHead(nn.Module):
  """Dense(fc) + ReLU -> Dense(labels); fc 0: the linear output layer alone."""

  fc: int
  num_labels: int

  @nn.compact
  def __call__(self, features):
    if self.fc:
      features = nn.relu(nn.Dense(self.fc, name="fc")(features))
    return nn.Dense(self.num_labels, name="logits")(features)


class MultiTaskModel(nn.Module):
  """`apply(params, batch, task)` -> logits [B, num_labels] of one task. Without `task`, `batch` is
  {task name: a batch of that task} and the result every task's logits: what `init` creates every
  head with, each from its own task's inputs (a BiLSTM's features are wider for a pair task)."""

  body: nn.Module
  heads: tuple  # ((task name, num_labels), ...)
  fc: int

  @nn.compact
  def __call__(self, batch, task: str | None = None, deterministic: bool = True):
    heads = {name: TaskHead(self.fc, n, name=f"head_{name}") for name, n in self.heads}
    if task is not None:
      return heads[task](self.body(batch, deterministic)).astype(jnp.float32)
    return {name: head(self.body(batch[name], deterministic)).astype(jnp.float32) for name, head in heads.items()}


def _lstm(body: type) -> Callable:
  def build(student, vocab_size: int, encoder_config):
    # Runs written before word vectors existed have no `word_vectors` in their student block.
    multichannel = bool(student.get("word_vectors")) and student.get("multichannel", False)
    return body(vocab_size, student.embed_dim, student.hidden, multichannel)

  return build


def _transformer(student, vocab_size: int, encoder_config: EncoderConfig | None):
  if encoder_config is None:
    raise UserError("a transformer student needs the encoder config of the run it starts from")
  return EncoderBody(
    encoder_config.replace(
      num_layers=student.num_layers, hidden_dropout=student.dropout, attention_dropout=student.dropout
    )
  )


@dataclasses.dataclass(frozen=True)
class StudentKind:
  """One kind of student. `joint`: it reads its teacher's `[CLS] a [SEP] b [SEP]` sequence (and
  starts from the first layers of an encoder); else each sentence on its own, without special
  tokens, as words (its vocabulary may be `student.word_vectors`'). `body(student block,
  vocab_size, encoder config) -> nn.Module`. Every kind takes single-sentence and pair tasks."""

  joint: bool
  body: Callable[..., nn.Module]


STUDENTS = {
  "bilstm": StudentKind(joint=False, body=_lstm(BiLSTMBody)),
  # The BiLSTM under the name runs written before one BiLSTM took both kinds of task used for its
  # pair form; they load as they were.
  "siamese_bilstm": StudentKind(joint=False, body=_lstm(BiLSTMBody)),
  "biattentive": StudentKind(joint=False, body=_lstm(BiAttentiveBody)),
  "transformer": StudentKind(joint=True, body=_transformer),
}


def student_kind(kind: str) -> StudentKind:
  if kind not in STUDENTS:
    raise UserError(f"student.kind={kind!r} is not a student: choose one of {', '.join(STUDENTS)}")
  return STUDENTS[kind]


def make_student(student, heads: tuple, vocab_size: int, encoder_config: EncoderConfig | None = None) -> MultiTaskModel:
  """The student of a config's `student` block; `encoder_config` is the teacher's (Transformer kind)."""
  body = student_kind(student.kind).body(student, vocab_size, encoder_config)
  return MultiTaskModel(body, tuple(heads), student.fc)


def refined_teacher(encoder_config: EncoderConfig, heads: tuple) -> MultiTaskModel:
  """The multi-task refined teacher: shared encoder, one linear output layer per task."""
  return MultiTaskModel(EncoderBody(encoder_config, readout="pooler"), tuple(heads), 0)
