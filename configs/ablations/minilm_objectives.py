"""MiniLM table 3/5/6 and supplementary tables 7/8 as one batch of runs: a 3x384 student of BERT-base.

for v in minilm mlm_kd tinybert tinybert_last_layer layer_last_two layer_first_and_last layer_all value_mse \
    hidden_mse no_value_relation; do
  python -m minilm_jax.train --config configs/ablations/minilm_objectives.py:$v --workdir workdirs/abl_$v
done
"""

from minilm_jax.distill.config import paper_config

VARIANTS = {
  "minilm": {},
  "mlm_kd": {"objective": "mlm_kd"},  # table 3's MLM-KD (soft-label distillation; the teacher needs its MLM head)
  "no_value_relation": {"relations": "qk"},  # table 5: attention transfer alone
  "value_mse": {"objective": "value_mse"},  # table 6
  "hidden_mse": {"objective": "hidden_mse"},  # supplementary table 7
  # Table 3's TinyBERT: its layer-wise general distillation (embeddings, attention scores and
  # hidden states at every layer of the uniform mapping).
  "tinybert": {"objective": "tinybert_layerwise"},
  "tinybert_last_layer": {"objective": "tinybert"},  # the last-layer form ETD distils with
  "layer_last_two": {"objective": "layer_to_layer", "layer_map": "last_two"},  # supplementary table 8
  "layer_first_and_last": {"objective": "layer_to_layer", "layer_map": "first_and_last"},
  "layer_all": {"objective": "layer_to_layer", "layer_map": "all"},
}


def get_config(variant="minilm"):
  c = paper_config("bert-base-uncased", 3, 384, batch_size=256, lr=3e-4)
  v = VARIANTS[variant]
  c.loss.objective = v.get("objective", "minilm")
  c.loss.layer_map = v.get("layer_map", "last")
  c.loss.relations = v.get("relations", "minilm")
  return c
