"""MiniLM's three students of BERT-base (table 3: 6x384, 12x384, 6x768) distilled in one run, the
teacher's forward pass computed once a batch for all three (`distill.family`): about 1.5 times
cheaper than three runs at batch 256 x 512 by the parts' FLOPs (`bench distill --family`). The
family shares the batch (256: the paper gave 6x768 a batch of 1024) and the schedule; each student
keeps its own width's relation heads and rate. Export one with
`python -m minilm_jax.convert --to-hf --workdir <workdir> --student 6x384 --out <dir>`."""

from minilm_jax.distill.config import paper_config


def get_config():
  c = paper_config("bert-base-uncased", 6, 384, batch_size=256, lr=3e-4)
  c.family = (
    dict(name="6x384"),
    dict(name="12x384", student=dict(num_layers=12)),
    dict(name="6x768", student=dict(hidden_size=768, intermediate_size=3072), optimizer=dict(lr=5e-4)),
  )
  return c
