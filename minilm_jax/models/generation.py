"""Decoding for sequence-to-sequence models: beam search (greedy is the one-beam case) with a
length penalty, minimum and maximum output length, n-gram blocking and banned tokens, jitted with
static shapes (a `lax.while_loop` over at most `max_length` steps); the source is encoded once and
every step feeds one token per beam through the cached keys and values.

Scores follow fairseq and transformers: a finished hypothesis of L tokens (its end token counted)
scores sum(log p) / L ** length_penalty; one that reaches `max_length` without ending is finished
there. A blocked or banned token gets -inf before the beams are chosen (the distribution is not
renormalised). The loop stops once no live beam can beat the worst kept finished one, which leaves
the result exactly that of running every step.
"""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp

NEG_INF = -1e9  # a score no hypothesis reaches, finite so that sums stay comparable


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
  beam_size: int = 1
  max_length: int = 48  # output tokens, the end token not counted
  min_length: int = 0  # output tokens before the end token may be chosen
  length_penalty: float = 1.0
  no_repeat_ngram: int = 0  # > 0: no n-gram of this size occurs twice in an output
  end_id: int = 102  # BERT's [SEP]
  banned_ids: tuple = ()  # never generated (padding, [CLS], [MASK], ...)
  mask_id: int = 103  # BERT's [MASK]: what a model with masked targets predicts each token from


def _blocked_ngrams(seqs_NxT, step, n: int, vocab: int):
  """[N, vocab] True where a token at `step` would repeat an n-gram of `seqs[:, :step]`."""
  num, length = seqs_NxT.shape
  starts = jnp.arange(length - n + 1)
  windows = seqs_NxT[:, starts[:, None] + jnp.arange(n - 1)[None, :]]  # [N, starts, n-1]
  tail = jnp.take(seqs_NxT, jnp.clip(step - (n - 1) + jnp.arange(n - 1), 0, length - 1), axis=1)  # [N, n-1]
  match = jnp.all(windows == tail[:, None, :], axis=-1) & (starts + n - 1 < step)[None, :] & (step >= n - 1)
  following = seqs_NxT[:, starts + n - 1]  # the token after each window
  rows = jnp.broadcast_to(jnp.arange(num)[:, None], following.shape)
  return jnp.zeros((num, vocab), bool).at[rows, following].max(match)


def _allowed_log_probs(logits_NxV, seqs_NxT, step, s: DecodeSettings):
  logp = jax.nn.log_softmax(logits_NxV.astype(jnp.float32), axis=-1)
  vocab = logp.shape[-1]
  banned = (
    jnp.zeros((vocab,), bool).at[jnp.asarray(s.banned_ids, jnp.int32)].set(True)
    if s.banned_ids
    else jnp.zeros((vocab,), bool)
  )
  banned = banned[None, :] | ((jnp.arange(vocab) == s.end_id) & (step < s.min_length))[None, :]
  if s.no_repeat_ngram:
    banned = banned | _blocked_ngrams(seqs_NxT, step, s.no_repeat_ngram, vocab)
  return jnp.where(banned, NEG_INF, logp)


def beam_search(first_logits_BxV, step_fn, state, s: DecodeSettings):
  """(tokens [B, max_length], lengths [B], scores [B]) of each row's best hypothesis; `tokens` end
  with the end token (when it was chosen) and zeros after it, `lengths` count the tokens before it.

  `first_logits_BxV` score the first token; `step_fn(tokens [B*K], state, step) -> (logits
  [B*K, vocab], state)` feeds token `step` of every beam (row b's K beams are rows b*K .. b*K+K-1)
  and scores the next. `state` is a pytree of [B, ...] arrays (a cache, the source mask), copied
  per beam and reordered with the beams.
  """
  batch, vocab = first_logits_BxV.shape
  k, length = s.beam_size, s.max_length
  expand = lambda x: jnp.repeat(x, k, axis=0)
  # Only the first beam is live at the start, so that the K copies do not all pick the same tokens.
  alive_logp = jnp.where(jnp.arange(k) == 0, 0.0, NEG_INF)[None, :].repeat(batch, 0)
  carry = dict(
    step=jnp.zeros((), jnp.int32),
    logits=expand(first_logits_BxV),
    state=jax.tree.map(expand, state),
    alive_seqs=jnp.zeros((batch, k, length), jnp.int32),
    alive_logp=alive_logp,
    done_seqs=jnp.zeros((batch, k, length), jnp.int32),
    done_scores=jnp.full((batch, k), NEG_INF),
    done_lengths=jnp.zeros((batch, k), jnp.int32),
  )
  penalty = lambda n: jnp.asarray(n, jnp.float32) ** s.length_penalty

  def can_improve(c):
    # The best a live beam can still score: its log-probability only falls, and its length penalty
    # is at most the larger of the next length's and max_length's.
    best_alive = jnp.max(c["alive_logp"], axis=1) / jnp.maximum(penalty(c["step"] + 1), penalty(length))
    return (c["step"] < length) & jnp.any(best_alive > c["done_scores"][:, -1])

  def body(c):
    step = c["step"]
    logp = _allowed_log_probs(c["logits"], c["alive_seqs"].reshape(batch * k, length), step, s).reshape(batch, k, vocab)
    candidates = (c["alive_logp"][:, :, None] + logp).reshape(batch, k * vocab)
    top_logp, top = jax.lax.top_k(candidates, 2 * k)  # at most K of them end (one end token per beam)
    beam, token = top // vocab, top % vocab
    seqs = jnp.take_along_axis(c["alive_seqs"], beam[:, :, None], axis=1)
    seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, :, None], step, axis=2)
    valid = top_logp > NEG_INF / 2
    ends = (token == s.end_id) | (step == length - 1)
    # Finished: the kept ones and the new, best K of both.
    new_scores = jnp.where(ends & valid, top_logp / penalty(step + 1), NEG_INF)
    new_lengths = jnp.where(token == s.end_id, step, step + 1)
    scores = jnp.concatenate([c["done_scores"], new_scores], axis=1)
    done_scores, keep = jax.lax.top_k(scores, k)
    done_seqs = jnp.take_along_axis(jnp.concatenate([c["done_seqs"], seqs], axis=1), keep[:, :, None], axis=1)
    done_lengths = jnp.take_along_axis(jnp.concatenate([c["done_lengths"], new_lengths], axis=1), keep, axis=1)
    # Live: the best K that did not end.
    alive_logp, keep = jax.lax.top_k(jnp.where(ends, NEG_INF, top_logp), k)
    alive_seqs = jnp.take_along_axis(seqs, keep[:, :, None], axis=1)
    rows = (jnp.arange(batch)[:, None] * k + jnp.take_along_axis(beam, keep, axis=1)).reshape(-1)
    state = jax.tree.map(lambda x: x[rows], c["state"])
    logits, state = step_fn(alive_seqs[:, :, step].reshape(-1), state, step)
    return dict(
      step=step + 1,
      logits=logits,
      state=state,
      alive_seqs=alive_seqs,
      alive_logp=alive_logp,
      done_seqs=done_seqs,
      done_scores=done_scores,
      done_lengths=done_lengths,
    )

  c = jax.lax.while_loop(can_improve, body, carry)
  tokens = c["done_seqs"][:, 0]
  lengths = c["done_lengths"][:, 0]
  tokens = jnp.where(jnp.arange(length)[None, :] <= lengths[:, None], tokens, 0)
  return tokens, lengths, c["done_scores"][:, 0]


def generate(model, params, batch, settings: DecodeSettings):
  """Decodes a `Seq2SeqLM` from the source blocks of `batch` (the model's inputs: input_ids,
  attention_mask, token_type_ids): (tokens [B, max_length], lengths [B])."""
  source_length = batch["input_ids"].shape[1] - model.target_length
  source = [batch[k][:, :source_length] for k in ("input_ids", "attention_mask", "token_type_ids")]
  first_logits, keys, values = model.apply({"params": params}, *source, method=type(model).encode_source)
  if model.masked_targets:
    # The first token from a [MASK] after the source; the end token must fit in the target block.
    settings = dataclasses.replace(settings, max_length=min(settings.max_length, model.target_length - 1))
    decode = partial(model.apply, method=type(model).decode_masked, mask_id=settings.mask_id)
    first_logits, keys, values = decode({"params": params}, None, keys, values, source[1], 0)
  else:
    decode = partial(model.apply, method=type(model).decode_step)

  def step_fn(tokens, state, step):
    keys, values, source_mask = state
    logits, keys, values = decode({"params": params}, tokens, keys, values, source_mask, step)
    return logits, (keys, values, source_mask)

  tokens, lengths, _ = beam_search(first_logits, step_fn, (keys, values, source[1]), settings)
  return {"tokens": tokens, "lengths": lengths}
