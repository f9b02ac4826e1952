"""First-order Taylor importance of neurons under the teacher's masked-LM loss (ETD-Impt, ETD
equations 5-8 after Michel et al., 2019).

Removing a neuron changes a sentence's loss L(x) by about `sum_t a_t * dL(x)/da_t` (the first-order
Taylor term, summed over the sentence's real tokens t); its importance is the absolute value of
that change, summed over the scoring sentences: `I = sum_x |sum_t a_t(x) * dL(x)/da_t(x)|`
(Michel et al.'s `E_x |A(x)^T dL(x)/dA(x)|`, not the sum of per-token absolute values, which
counts a neuron whose effects cancel within a sentence as important). L(x) is the sentence's own
masked-LM loss, the mean cross-entropy of its masked tokens, so each sentence's gradient is its
own. `dL/da` comes from the encoder's zero "perturbations" (see `encoder._probe`), `a` from its
sown "intermediates", in one backward pass per batch.

A head neuron (dimension j of head h) is scored by its context output, the value that W_O reads:
extracting it removes column j of that head's W_Q, W_K, W_V and row j of W_O together, and the
context output is the one activation that exists once per such neuron (its Q and K dimensions act
only through the attention weights, which mix all of the head's dimensions), so the first-order
change of the loss when the neuron goes is what its output carries. The paper's text lost its
equations; this is our reading (../shared/DESIGN.md).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from minilm_jax.models import layout
from minilm_jax.models.heads import MaskedLM
from minilm_jax.transfer.objectives import Masking

MASK_PROB = 0.15


def mlm_mask(input_ids, attention_mask, masking: Masking, vocab_size: int, rng: np.random.Generator):
  """BERT's masking on the host (`objectives.mlm_mask` is the step's, on the device), `masking` the
  tokenizer's (special ids, mask id): 15% of real, non-special tokens are predicted; of those 80%
  become [MASK], 10% a random token, 10% stay. Returns (masked ids, label weights)."""
  special_ids, mask_id = masking
  candidates = attention_mask.astype(bool) & ~np.isin(input_ids, list(special_ids))
  chosen = (rng.random(input_ids.shape) < MASK_PROB) & candidates
  roll = rng.random(input_ids.shape)
  ids = np.where(chosen & (roll < 0.8), mask_id, input_ids)
  ids = np.where(chosen & (roll >= 0.8) & (roll < 0.9), rng.integers(0, vocab_size, input_ids.shape), ids)
  return ids.astype(np.int32), chosen.astype(np.float32)


def mlm_loss(logits_BxLxV, labels_BxL, weights_BxL):
  ce = optax.softmax_cross_entropy_with_integer_labels(logits_BxLxV, labels_BxL)
  return jnp.sum(ce * weights_BxL) / jnp.maximum(jnp.sum(weights_BxL), 1.0)


def _neuron_grads(model, params, perturbations, batch):
  """(activations, dL/dactivations) of every probed neuron, for one batch."""

  def loss(p):
    logits, state = model.apply(
      {"params": params, "perturbations": p},
      batch["masked_ids"],
      batch["attention_mask"],
      batch["token_type_ids"],
      mutable=["intermediates"],
    )
    # The sum of every sentence's own loss: its tokens' gradients are those of its L(x) alone.
    per_sentence = jax.vmap(mlm_loss)(logits[:, None], batch["input_ids"][:, None], batch["weights"][:, None])
    return jnp.sum(per_sentence), state["intermediates"]

  grads, activations = jax.grad(loss, has_aux=True)(perturbations)
  return jax.tree.map(lambda t: t[0], activations, is_leaf=lambda t: isinstance(t, tuple)), grads


def taylor_scores(config, encoder_params, mlm_params, batches) -> dict:
  """Scores of every neuron: {"hidden": [H], "layers": [{"hidden": [H] (MHA input), "heads": [A, d_k], "ffn": [I]}]}.

  `batches` yield dicts with input_ids, attention_mask, token_type_ids, masked_ids, weights (numpy).
  """
  model = MaskedLM(config.replace(dtype="float32"))
  params = {"encoder": encoder_params, **mlm_params}

  @jax.jit
  def batch_scores(batch):
    zeros = jax.tree.map(
      lambda s: jnp.zeros(s.shape, s.dtype),
      jax.eval_shape(
        lambda: model.init(jax.random.key(0), batch["input_ids"], batch["attention_mask"])["perturbations"]
      ),
    )
    activations, grads = _neuron_grads(model, params, zeros, batch)
    real = batch["attention_mask"].astype(jnp.float32)[..., None]
    return jax.tree.map(lambda a, g: jnp.sum(jnp.abs(jnp.sum(a * g * real, axis=1)), axis=0), activations, grads)

  total: Any = None
  for batch in batches:
    scores = jax.device_get(batch_scores({k: jnp.asarray(v) for k, v in batch.items()}))
    total = scores if total is None else jax.tree.map(np.add, total, scores)
  probes = [total["encoder"][layout.layer_name(i)] for i in range(config.num_layers)]
  layers = [
    {
      "hidden": probe["attention"]["input"],
      "heads": probe["attention"]["heads"].reshape(config.num_heads, config.head_dim),
      "ffn": probe["ffn"],
    }
    for probe in probes
  ]
  return {"hidden": sum(layer["hidden"] for layer in layers), "layers": layers}
