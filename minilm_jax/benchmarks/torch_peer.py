"""The PyTorch peer of the distillation step (`bench distill`'s `eager` and `compile` rows):
transformers' teacher and student of the measurement's architecture (BERT's, MPNet's, DeBERTa's,
ModernBERT's) at its shapes, MiniLM's Q-K and V-V relation KLs of their last layers' queries, keys
and values (captured by forward hooks on their projections; ModernBERT's rotated as its attention
rotates them), AdamW, on CUDA when torch has it."""

import contextlib
import math
from functools import partial
from typing import Any

from minilm_jax.devices.timing import median_seconds
from minilm_jax.models import hf

# Where each architecture's last layer projects its queries, keys and values, in transformers.
_PROJECTIONS = {
  "mpnet": ("attention.attn", ("q", "k", "v")),
  "deberta-v2": ("attention.self", ("query_proj", "key_proj", "value_proj")),
}
_BERT_PROJECTIONS = ("attention.self", ("query", "key", "value"))


def relation_kl(teacher_xy, student_xy, mask, num_heads):
  """MiniLM's relation KL in PyTorch, of the teacher's (x, y) relation against the student's."""
  import torch

  def log_probs(x, y):
    b, l, h = x.shape
    x = x.view(b, l, num_heads, h // num_heads).transpose(1, 2)
    y = y.view(b, l, num_heads, h // num_heads).transpose(1, 2)
    scores = (x.float() @ y.float().transpose(-1, -2)) / math.sqrt(h // num_heads)
    return torch.log_softmax(scores.masked_fill(~mask[:, None, None, :], -1e9), dim=-1)

  t, s = log_probs(*teacher_xy), log_probs(*student_xy)
  p = t.exp()
  kl = torch.where(p > 0, p * (t - s), torch.zeros_like(p)).sum(-1)
  real = mask.float()
  return ((kl * real[:, None, :]).sum((1, 2)) / (num_heads * real.sum(-1))).mean()


def _keep_first(captured: dict, key: str, module, inputs, output):
  """A forward hook keeping a projection's first output of a forward pass (DeBERTa's layers then map
  the relative embeddings with the same maps); None, so the output is not replaced."""
  if key not in captured:
    captured[key] = output


def _keep_rotation(captured: dict, key: str, module, args, kwargs):
  """A forward pre-hook keeping the (cos, sin) a ModernBERT attention rotates by; None: inputs unchanged."""
  captured[key] = kwargs["position_embeddings"]


def _capture(captured: dict, model, config, prefix: str):
  """Hooks on `model`'s last layer that put its queries, keys and values into `captured`; returns
  `read() -> {"query", "key", "value"}` ([B, L, D] each), which takes them out again."""
  names = ("query", "key", "value")
  if config.architecture.rotary:  # one fused map, then the rotation inside the attention
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    attention = model.layers[-1].attn
    attention.Wqkv.register_forward_hook(partial(_keep_first, captured, prefix + "qkv"))
    attention.register_forward_pre_hook(partial(_keep_rotation, captured, prefix + "rotation"), with_kwargs=True)

    def read():
      qkv = captured.pop(prefix + "qkv")
      b, length, _ = qkv.shape
      q, k, v = qkv.view(b, length, 3, config.num_heads, config.head_dim).unbind(2)
      q, k = apply_rotary_pos_emb(q, k, *captured.pop(prefix + "rotation"), unsqueeze_dim=2)
      return {name: x.reshape(b, length, -1) for name, x in zip(names, (q, k, v))}

    return read
  where, theirs = _PROJECTIONS.get(config.model_type, _BERT_PROJECTIONS)
  attention = model.encoder.layer[-1].get_submodule(where)
  for ours, projection in zip(names, theirs):
    getattr(attention, projection).register_forward_hook(partial(_keep_first, captured, prefix + ours))
  return lambda: {name: captured.pop(prefix + name) for name in names}


def _step(m, batch, compiled: bool):
  """The PyTorch step and its device ("cuda" when torch has one, else "cpu")."""
  import torch
  import transformers

  device = "cuda" if torch.cuda.is_available() else "cpu"

  def model(config, mode):
    """transformers' model of our `config`'s architecture: SDPA attention where it has it."""
    d = hf.config_to_hf(config)
    hf_config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    try:
      built = transformers.AutoModel.from_config(hf_config, attn_implementation="sdpa")
    except ValueError:  # DeBERTa's attention is its own
      built = transformers.AutoModel.from_config(hf_config, attn_implementation="eager")
    return getattr(built, mode)().to(device)

  teacher, student = model(m.teacher_config, "eval"), model(m.student_config, "train")
  captured: dict[str, Any] = {}
  read_teacher = _capture(captured, teacher, m.teacher_config, "t_")
  read_student = _capture(captured, student, m.student_config, "s_")
  optimizer = torch.optim.AdamW(
    student.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, fused=device == "cuda"
  )
  # MPNet's, DeBERTa-v3's and ModernBERT's models have no token types (MPNet's and ModernBERT's take
  # no such input).
  given = {k: v for k, v in batch.items() if k != "token_type_ids" or m.teacher_config.type_vocab_size}
  inputs = {k: torch.tensor(v, dtype=torch.long, device=device) for k, v in given.items()}
  mask = inputs["attention_mask"].bool()
  autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) if m.dtype == "bfloat16" else contextlib.nullcontext
  num_relation_heads = m.num_relation_heads

  def loss_of(inputs, mask):
    with autocast():
      with torch.no_grad():
        teacher(**inputs)
      student(**inputs)
    # Popped, so that every call starts with the dict empty: torch.compile's guards then hold.
    t, s = read_teacher(), read_student()
    return sum(
      relation_kl((t[x], t[y]), (s[x], s[y]), mask, num_relation_heads)
      for x, y in (("query", "key"), ("value", "value"))
    )

  loss_fn = torch.compile(loss_of) if compiled else loss_of

  def run():
    loss = loss_fn(inputs, mask)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if device == "cuda":
      torch.cuda.synchronize()

  return run, device


def seconds_and_peak(m, batch, compiled: bool, repeats: int):
  """(median seconds of a step, CUDA's peak bytes or None) of the peer at `m`'s shapes (a
  `distill.Measurement`), compiled by `torch.compile` or eager."""
  import torch

  run, device = _step(m, batch, compiled)
  if device == "cuda":
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  seconds = median_seconds(run, repeats)
  peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
  del run
  if device == "cuda":
    torch.cuda.empty_cache()
  return seconds, peak
