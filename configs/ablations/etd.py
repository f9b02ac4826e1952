"""ETD table 1 / table 2 as one batch of runs: a 6x384 student of BERT-base, each initialisation.

  for v in random etd_rand etd_impt etd_wo_hidn_con etd_impt_top etd_impt_bottom \
      etd_impt_rev_ffn etd_impt_rev_head etd_impt_rev_hidden etd_impt_rev_all; do
    python -m minilm_jax.train --config configs/ablations/etd.py:$v --workdir workdirs/etd_$v
  done

ETD distils with the last-layer TinyBERT objective (attention-score MSE + hidden MSE through W_h),
with its own schedule (ETD section 4.1): batch 128, lr 1e-4, 10% warm-up, 5 epochs over the corpus
(`data.epochs`: the step count follows from the corpus's size), not MiniLM's 400k steps.
"""

from minilm_jax.distill.config import paper_config

VARIANTS = {
  "random": {"init": "random"},
  "etd_rand": {"init": "etd", "method": "rand"},
  "etd_impt": {"init": "etd", "method": "impt"},
  "etd_wo_hidn_con": {"init": "etd", "method": "impt", "hidden_consistency": False},
  "etd_impt_top": {"init": "etd", "method": "impt", "layers": "top"},
  "etd_impt_bottom": {"init": "etd", "method": "impt", "layers": "bottom"},
  # Table 2: keep the least important neurons of one type, or of all three.
  **{f"etd_impt_rev_{kind}": {"init": "etd", "method": "impt", "reverse": kind} for kind in ("ffn", "head", "hidden")},
  "etd_impt_rev_all": {"init": "etd", "method": "impt", "reverse": "all"},
}


def get_config(variant="etd_impt"):
  c = paper_config("bert-base-uncased", 6, 384, batch_size=128, lr=1e-4)
  c.loss.objective = "tinybert"
  c.data.epochs, c.num_steps = 5, 0  # the step count follows from the corpus
  c.optimizer.warmup_proportion, c.optimizer.warmup_steps = 0.1, 0
  v = VARIANTS[variant]
  c.student.init = v["init"]
  c.etd.method = v.get("method", "rand")
  c.etd.hidden_consistency = v.get("hidden_consistency", True)
  c.etd.layers = v.get("layers", "uniform")
  c.etd.reverse = v.get("reverse", "")
  return c
