"""Task models: the encoder plus a head, laid out as transformers' BertForSequenceClassification
(pooler -> dropout -> `classifier`) and BertForQuestionAnswering (`qa_outputs` on every token)."""

import flax.linen as nn
import jax.numpy as jnp

from minilm_jax.models.encoder import Encoder, EncoderConfig

CLASSIFICATION, SPAN = "classification", "span"


class MaskedLM(nn.Module):
  """The encoder with BERT's masked-LM head (transformers' `cls.predictions`): dense -> GELU ->
  LayerNorm -> scores against the tied word embeddings + a bias. Logits [batch, length, vocab], float32."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    c = self.config
    out = Encoder(c, name="encoder")(input_ids, attention_mask, token_type_ids, deterministic)
    h = nn.Dense(c.hidden_size, param_dtype=jnp.float32, name="transform")(out.last_hidden_state)
    h = nn.LayerNorm(epsilon=c.layer_norm_eps, use_fast_variance=False, name="transform_LayerNorm")(
        nn.gelu(h, approximate=False))
    embedding = self.variables["params"]["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    bias = self.param("bias", nn.initializers.zeros, (c.vocab_size,))
    return (h.astype(jnp.float32) @ embedding.T + bias).astype(jnp.float32)


class SequenceClassifier(nn.Module):
  """Logits [batch, num_labels] (num_labels 1: a regression score) from the pooled [CLS] vector."""

  config: EncoderConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids, deterministic)
    x = nn.Dropout(self.config.hidden_dropout)(out.pooler_output, deterministic=deterministic)
    head = nn.Dense(self.num_labels, param_dtype=jnp.float32,
                    kernel_init=nn.initializers.normal(self.config.initializer_range), name="classifier")
    return head(x).astype(jnp.float32)


class SpanExtractor(nn.Module):
  """Start and end logits [batch, length] of an answer span."""

  config: EncoderConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, token_type_ids=None, deterministic: bool = True):
    out = Encoder(self.config, name="encoder")(input_ids, attention_mask, token_type_ids, deterministic)
    head = nn.Dense(2, param_dtype=jnp.float32, kernel_init=nn.initializers.normal(self.config.initializer_range),
                    name="qa_outputs")
    logits = head(out.last_hidden_state).astype(jnp.float32)
    return logits[..., 0], logits[..., 1]


def task_model(config: EncoderConfig, head: dict) -> nn.Module:
  """The model for a head description {"kind": "classification", "num_labels": n} or {"kind": "span"}."""
  if head["kind"] == CLASSIFICATION:
    return SequenceClassifier(config, head["num_labels"])
  return SpanExtractor(config)
