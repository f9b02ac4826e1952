"""`generate` suite: decoding speed of a sequence-to-sequence student (`Seq2SeqLM`, random weights
of the given shape), in output tokens per second. Ours encodes the source once and feeds one token
per beam and step through the cached keys and values, greedy and with 5 beams. Beside it, in the
same command, what a user of the exported `BertForMaskedLM` writes in PyTorch: transformers keeps
no cache for a model under a bidirectional source mask, so greedy decoding recomputes the whole
sequence at every step (the masked-LM head only on the position that predicts). Every hypothesis
runs the full output length (the end token is banned until then), so both sides do the same
number of steps."""

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from minilm_jax.devices.timing import block
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.generation import DecodeSettings, generate
from minilm_jax.models.heads import Seq2SeqLM

_END_ID, _BANNED_IDS = 102, (0, 100, 101, 103)  # BERT's [SEP]; [PAD], [UNK], [CLS], [MASK]


def _config(student: str, dtype: str) -> EncoderConfig:
  try:
    layers, hidden = (int(n) for n in student.split("x"))
  except ValueError:
    raise UserError(f"--student {student}: give layers x width, e.g. 6x384") from None
  return EncoderConfig(
    num_layers=layers,
    hidden_size=hidden,
    num_heads=12,
    intermediate_size=4 * hidden,
    dtype=dtype,
    hidden_dropout=0.0,
    attention_dropout=0.0,
  )


@dataclasses.dataclass(frozen=True)
class _Decoding:
  """What both decoders are timed on: the model's config, batch x (source + target) tokens, the
  compute dtype and how many timed repeats."""

  config: EncoderConfig
  batch: int
  source_length: int
  target_length: int
  dtype: str
  repeats: int


def _ours(d: _Decoding, beams: int):
  model = Seq2SeqLM(d.config, d.target_length)
  ids = jnp.zeros((1, d.source_length + d.target_length), jnp.int32)
  params = model.init(jax.random.key(0), ids, jnp.ones_like(ids))["params"]
  rng = np.random.default_rng(0)
  inputs = {
    "input_ids": np.concatenate(
      [rng.integers(1000, 30000, (d.batch, d.source_length)), np.zeros((d.batch, d.target_length), int)], 1
    ).astype(np.int32),
    "attention_mask": np.concatenate(
      [np.ones((d.batch, d.source_length)), np.zeros((d.batch, d.target_length))], 1
    ).astype(np.int32),
    "token_type_ids": np.zeros((d.batch, d.source_length + d.target_length), np.int32),
  }
  settings = DecodeSettings(
    beam_size=beams, max_length=d.target_length, min_length=d.target_length, end_id=_END_ID, banned_ids=_BANNED_IDS
  )
  decode = jax.jit(lambda p, b: generate(model, p, b, settings))
  block(decode(params, inputs))  # compile
  start = time.perf_counter()
  for _ in range(d.repeats):
    block(decode(params, inputs))
  return (time.perf_counter() - start) / d.repeats


def _transformers_greedy(d: _Decoding):
  import torch
  import transformers

  model = transformers.BertForMaskedLM(
    transformers.BertConfig(
      hidden_size=d.config.hidden_size,
      num_hidden_layers=d.config.num_layers,
      num_attention_heads=d.config.num_heads,
      intermediate_size=d.config.intermediate_size,
      attn_implementation="sdpa",
    )
  ).eval()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model.to(device)
  source = torch.randint(1000, 30000, (d.batch, d.source_length), device=device)

  def decode():
    ids = source
    with torch.inference_mode(), torch.autocast(device, torch.bfloat16, enabled=d.dtype == "bfloat16"):
      for step in range(d.target_length):
        # The user's own mask, built in torch (every step's length differs: a jitted mask would recompile).
        positions = torch.arange(d.source_length + step, device=device)
        in_target = positions >= d.source_length
        mask = (~in_target[None, :] | (in_target[:, None] & (positions[None, :] <= positions[:, None])))[None, None]
        types = torch.tensor([[0] * d.source_length + [1] * step], device=device).expand(d.batch, -1)
        # The encoder over the whole sequence, the masked-LM head on the one position that predicts.
        hidden = model.bert(
          input_ids=ids, attention_mask=mask.expand(d.batch, -1, -1, -1), token_type_ids=types
        ).last_hidden_state[:, -1 if step else d.source_length - 1]
        logits = model.cls(hidden)
        logits[:, [*_BANNED_IDS, _END_ID]] = -float("inf")
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    if device == "cuda":
      torch.cuda.synchronize()

  decode()  # warm-up
  start = time.perf_counter()
  for _ in range(d.repeats):
    decode()
  return (time.perf_counter() - start) / d.repeats


def run(
  student: str = "6x384",
  batch: int = 32,
  source_length: int = 128,
  target_length: int = 48,
  repeats: int = 3,
  dtype: str = "float32",
):
  config = _config(student, dtype)
  if source_length + target_length > config.max_position_embeddings:
    raise UserError(
      f"source {source_length} + target {target_length} tokens exceed {config.max_position_embeddings} "
      f"positions: shorten --seq_len or --target_length"
    )
  tokens = batch * target_length
  common = {
    "student": student,
    "batch": batch,
    "source_len": source_length,
    "target_len": target_length,
    "dtype": dtype,
  }
  decoding = _Decoding(
    config=config, batch=batch, source_length=source_length, target_length=target_length, dtype=dtype, repeats=repeats
  )
  peer = _transformers_greedy(decoding)
  rows = [
    {
      "decoder": "transformers BertForMaskedLM, greedy, full recompute",
      **common,
      "beams": 1,
      "seconds": peer,
      "tokens_per_s": tokens / peer,
      "speedup": 1.0,
    }
  ]
  for beams in (1, 5):
    seconds = _ours(decoding, beams)
    rows.append(
      {
        "decoder": "ours, cached",
        **common,
        "beams": beams,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "speedup": peer / seconds,
      }
    )
  return rows
