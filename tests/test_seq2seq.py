"""Sequence-to-sequence fine-tuning (UniLM-style): the mask, cached decoding against transformers'
BertForMaskedLM, beam search against brute force, the metrics against the libraries' documented
examples, and question generation and summarisation runs through fine-tuning, evaluation and export."""

import itertools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from conftest import ROOT, apply_overrides, load_config_module
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.finetuned_runs import evaluate_runs
from minilm_jax.finetuning.config import base_config
from minilm_jax.finetuning.run import build_finetuning
from minilm_jax.models import hf
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.models.generation import DecodeSettings, beam_search, generate
from minilm_jax.models.heads import Seq2SeqLM, real_positions, seq2seq_mask
from minilm_jax.tasks import generation_metrics, get_task
from minilm_jax.tasks.seq2seq import mask_targets

HAS_WORDNET = all(
  os.path.isfile(os.path.join("/usr/share/wordnet", f)) for f in ("data.verb", "index.noun", "verb.exc")
)
needs_wordnet = pytest.mark.skipif(not HAS_WORDNET, reason="METEOR needs WordNet 3.0 (apt-get install wordnet-base)")


def seq2seq_config(init, task, data_dir, **overrides):
  c = base_config()
  c.task, c.init, c.data_dir = task, init, data_dir
  c.max_seq_length, c.seq2seq.target_length = 40, 12
  c.batch_size, c.eval_batch_size, c.epochs = 8, 8, 2
  c.optimizer.lr, c.log_every, c.checkpoint.every = 1e-3, 1, 1000
  c.seq2seq.beam_size = 2
  c.mesh.data = 2  # as test_finetune's configs: 2 of the 8 fake devices
  return apply_overrides(c, overrides)


def tiny_seq2seq(target_length=4, **config):
  shape = dict(
    vocab_size=50,
    hidden_size=16,
    num_layers=2,
    num_heads=4,
    intermediate_size=32,
    max_position_embeddings=32,
    hidden_dropout=0.0,
    attention_dropout=0.0,
  )
  encoder = EncoderConfig(**{**shape, **config})
  model = Seq2SeqLM(encoder, target_length)
  ids = jnp.zeros((1, 8 + target_length), jnp.int32)
  return model, jax.jit(model.init)(jax.random.key(0), ids, jnp.ones_like(ids))["params"]  # one program, not op by op


def blocks(rng, batch, source_length, target_length, vocab=50):
  """Random [source | target] blocks with padding in both: input_ids, attention_mask, token_type_ids."""
  ids = rng.integers(5, vocab, (batch, source_length + target_length))
  source_real = rng.integers(2, source_length + 1, batch)
  target_real = rng.integers(1, target_length + 1, batch)
  mask = np.zeros_like(ids)
  for b in range(batch):
    mask[b, : source_real[b]] = 1
    mask[b, source_length : source_length + target_real[b]] = 1
  ids = np.where(mask == 1, ids, 0)
  types = np.concatenate([np.zeros((batch, source_length)), np.ones((batch, target_length))], 1).astype(np.int32)
  return {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(mask), "token_type_ids": jnp.asarray(types)}


# --- the mask -------------------------------------------------------------------------------------


def test_seq2seq_mask_source_never_sees_target_and_target_never_sees_its_right():
  mask = np.ones((1, 5))
  mask[0, 2] = 0  # source padding
  m = np.asarray(seq2seq_mask(jnp.asarray(mask), 3))[0]
  expected = np.array(
    [
      [1, 1, 0, 0, 0],  # source tokens: the real source only
      [1, 1, 0, 0, 0],
      [1, 1, 0, 0, 0],
      [1, 1, 0, 1, 0],  # target token 0: the source and itself
      [1, 1, 0, 1, 1],
    ],
    bool,
  )
  np.testing.assert_array_equal(m, expected)


def test_model_predictions_depend_only_on_what_the_mask_allows():
  model, params = tiny_seq2seq(target_length=4)
  batch = blocks(np.random.default_rng(0), 3, 6, 4)
  apply = jax.jit(model.apply)
  logits = apply({"params": params}, **batch)
  assert logits.shape == (3, 5, 50)
  for j in range(4):  # change target token j: predictions made before it (slots 0..j) do not move
    changed = dict(batch, input_ids=batch["input_ids"].at[:, 6 + j].set(7))
    moved = apply({"params": params}, **changed)
    np.testing.assert_allclose(moved[:, : j + 1], logits[:, : j + 1], atol=1e-6)
    assert np.abs(moved[:, j + 1 :] - logits[:, j + 1 :]).max() > 1e-4 or j == 3


# --- UniLM's masked targets ------------------------------------------------------------------------


@pytest.mark.slow
def test_the_masked_and_one_pass_forms_read_one_encoder_pass_at_different_positions():
  """The same parameters and inputs: the masked form's prediction at target position j is the
  one-pass form's prediction slot j + 1 (the output at target position j). Only which output
  predicts which token differs."""
  model, params = tiny_seq2seq(target_length=4)
  masked = Seq2SeqLM(model.config, 4, masked_targets=True)
  batch = blocks(np.random.default_rng(2), 3, 6, 4)
  one_pass = np.asarray(model.apply({"params": params}, **batch))
  ours = np.asarray(masked.apply({"params": params}, **batch))
  assert ours.shape == (3, 4, 50)
  np.testing.assert_allclose(ours, one_pass[:, 1:], atol=1e-6)


def _one_pass_batch(rng, batch, source_length, target_length, pad=0):
  """What `Seq2SeqTask.features` gives: targets t_1..t_n in the block, labels t_1..t_n [SEP] -1..."""
  b = blocks(rng, batch, source_length, target_length)
  target_real = np.asarray(b["attention_mask"][:, source_length:]).sum(1)
  targets = np.asarray(b["input_ids"][:, source_length:])
  labels = np.full((batch, target_length + 1), -1)
  for i, n in enumerate(target_real):
    labels[i, :n] = targets[i, :n]
    labels[i, n] = 4  # the end token
  return {**b, "labels": jnp.asarray(labels)}


def test_mask_targets_changes_only_chosen_target_tokens_as_unilm_does():
  rng = np.random.default_rng(3)
  source_length, target_length, mask_id, vocab = 5, 8, 3, 50
  batch = _one_pass_batch(rng, 4000, source_length, target_length)
  out = mask_targets(batch, jax.random.key(0), 0.5, pad_id=0, mask_id=mask_id, vocab_size=vocab)
  ids, labels, fed = np.asarray(out["input_ids"]), np.asarray(out["labels"]), np.asarray(batch["labels"])
  np.testing.assert_array_equal(ids[:, :source_length], np.asarray(batch["input_ids"])[:, :source_length])
  np.testing.assert_array_equal(
    np.asarray(out["attention_mask"])[:, :source_length], batch["attention_mask"][:, :source_length]
  )
  targets = fed[:, :target_length]  # t_1 .. t_n [SEP]: the end token is an input too
  real = targets >= 0
  np.testing.assert_array_equal(np.asarray(out["attention_mask"])[:, source_length:], real)
  chosen = labels >= 0
  assert labels.shape == (4000, target_length) and not (chosen & ~real).any()
  np.testing.assert_array_equal(labels[chosen], targets[chosen])
  # UniLM's count: max(1, round(0.5 * (n + 1))) of the n tokens and the end.
  np.testing.assert_array_equal(chosen.sum(1), np.maximum(1, np.round(real.sum(1) * 0.5)))
  block = ids[:, source_length:]
  np.testing.assert_array_equal(block[real & ~chosen], targets[real & ~chosen])  # the rest as they were
  assert (block[~real] == 0).all()
  as_mask = (block[chosen] == mask_id).mean()
  kept = (block[chosen] == targets[chosen]).mean()
  assert abs(as_mask - 0.8) < 0.015 and 0.085 < kept < 0.125  # 10 % kept, plus random draws of itself
  # Every position of the end is chosen as often as any other (about half of the time here).
  ends = targets == 4
  assert abs(chosen[ends].mean() - chosen[real & ~ends].mean()) < 0.05


def test_masked_decoding_equals_its_full_recompute():
  """Greedy decoding of the masked form (two cached positions a step) against running the whole
  model on [source | chosen tokens, [MASK]] at every step and reading the [MASK]'s prediction."""
  source_length, target_length, mask_id, end_id = 6, 5, 3, 4
  model, params = tiny_seq2seq(target_length=target_length)
  params = jax.tree.map(lambda x: x * 4 if x.ndim == 2 else x, params)  # sharper distributions: fewer ties
  masked = Seq2SeqLM(model.config, target_length, masked_targets=True)
  batch = blocks(np.random.default_rng(4), 3, source_length, target_length)
  banned = (0, 1, 2, mask_id)
  settings = DecodeSettings(beam_size=1, max_length=target_length, end_id=end_id, banned_ids=banned, mask_id=mask_id)
  decoded = jax.jit(lambda p, b: generate(masked, p, b, settings))(params, batch)
  apply = jax.jit(masked.apply)
  for b in range(3):
    ids = np.asarray(batch["input_ids"][b, :source_length]).tolist()
    mask = np.asarray(batch["attention_mask"][b, :source_length]).tolist()
    generated = []
    for _ in range(target_length - 1):  # the end token must fit in the block: at most 4 tokens
      fill = target_length - len(generated) - 1
      full = {
        "input_ids": jnp.asarray([ids + generated + [mask_id] + [0] * fill]),
        "attention_mask": jnp.asarray([mask + [1] * (len(generated) + 1) + [0] * fill]),
        "token_type_ids": jnp.asarray([[0] * source_length + [1] * target_length]),
      }
      logits = np.array(apply({"params": params}, **full))[0, len(generated)]
      logits[list(banned)] = -np.inf
      generated.append(int(np.argmax(logits)))
      if generated[-1] == end_id:
        break
    assert np.asarray(decoded["tokens"][b, : len(generated)]).tolist() == generated
    assert int(decoded["lengths"][b]) == (len(generated) - 1 if generated[-1] == end_id else len(generated))


@pytest.mark.slow
def test_masked_target_fine_tuning_trains_decodes_and_evaluates_again(tiny_mlm_teacher, summary_dir, tmp_path):
  """The paper configs' form (qg, xsum and cnndm set UniLM's mask_prob 0.7; the base config and the
  offline demo the one-pass form) through the program: the run records the form, and its batch
  evaluation decodes it the same way (its own score again)."""
  shipped = {
    name: load_config_module(os.path.join(ROOT, "configs", "finetune", f"{name}.py")).get_config().seq2seq.mask_prob
    for name in ("qg", "xsum", "cnndm", "wordnet_definitions")
  }
  assert shipped == {"qg": 0.7, "xsum": 0.7, "cnndm": 0.7, "wordnet_definitions": 0.0}
  run = str(tmp_path / "masked")
  config = seq2seq_config(tiny_mlm_teacher, "cnndm", summary_dir, epochs=1, **{"seq2seq.mask_prob": shipped["cnndm"]})
  _, results = build_finetuning(config, run).run()
  assert runs.read_record(run).head == {"kind": "seq2seq", "target_length": 12, "masked_targets": True}
  (row,) = evaluate_runs([run], str(tmp_path / "eval"), batch_size=8)
  assert row["rouge1"] == pytest.approx(results["dev/rouge1"], abs=1e-6)
  runs.export_run(run, str(tmp_path / "hf"))
  layout = json.load(open(tmp_path / "hf" / "seq2seq.json"))
  assert layout["prediction"].startswith("UniLM's masked targets")
  with pytest.raises(UserError, match="seq2seq.mask_prob=1.5 must lie in"):
    build_finetuning(
      seq2seq_config(tiny_mlm_teacher, "cnndm", summary_dir, **{"seq2seq.mask_prob": 1.5}), str(tmp_path / "x")
    )


# --- decoding against transformers ---------------------------------------------------------------------


def _hf_logits(model, batch, source_length):
  """BertForMaskedLM's logits with the mask and positions a user builds for an exported model."""
  mask = np.asarray(seq2seq_mask(batch["attention_mask"], source_length))[:, None]
  with torch.no_grad():
    return model(
      input_ids=torch.tensor(np.asarray(batch["input_ids"])),
      attention_mask=torch.tensor(mask),
      token_type_ids=torch.tensor(np.asarray(batch["token_type_ids"])),
      position_ids=torch.tensor(np.asarray(real_positions(batch["attention_mask"], EncoderConfig()))),
    ).logits


@pytest.mark.slow
def test_exported_model_matches_transformers_and_cached_greedy_equals_its_full_recompute(tmp_path, minilm_dir):
  model, params = tiny_seq2seq(target_length=5, vocab_size=30522, max_position_embeddings=64)
  params = jax.tree.map(lambda x: x * 4 if x.ndim == 2 else x, params)  # sharper distributions: fewer ties
  out = str(tmp_path / "export")
  hf.save(out, model.config, params, hf.load_tokenizer(minilm_dir), {"kind": "seq2seq", "target_length": 5})
  torch_model = transformers.BertForMaskedLM.from_pretrained(out).eval()
  source_length, target_length = 7, 5
  batch = blocks(np.random.default_rng(1), 3, source_length, target_length, vocab=30522)
  ours = np.asarray(model.apply({"params": params}, **batch))
  theirs = _hf_logits(torch_model, batch, source_length).numpy()
  slots = np.concatenate(
    [
      np.asarray(batch["attention_mask"][:, :source_length].sum(1) - 1)[:, None],
      source_length + np.arange(target_length)[None].repeat(3, 0),
    ],
    1,
  )
  np.testing.assert_allclose(ours, np.take_along_axis(theirs, slots[:, :, None], 1), atol=2e-4)

  settings = DecodeSettings(beam_size=1, max_length=target_length, end_id=102, banned_ids=(0, 100, 101, 103))
  decoded = jax.jit(lambda p, b: generate(model, p, b, settings))(params, batch)
  # The reference: greedy decoding that recomputes the whole sequence with transformers at every step.
  for b in range(3):
    src = int(batch["attention_mask"][b, :source_length].sum())
    ids = np.asarray(batch["input_ids"][b, :source_length]).tolist()
    mask = np.asarray(batch["attention_mask"][b, :source_length]).tolist()
    generated = []
    for _ in range(target_length):
      full = {
        "input_ids": jnp.asarray([ids + generated + [0] * (target_length - len(generated))]),
        "attention_mask": jnp.asarray([mask + [1] * len(generated) + [0] * (target_length - len(generated))]),
        "token_type_ids": jnp.asarray([[0] * source_length + [1] * target_length]),
      }
      logits = _hf_logits(torch_model, full, source_length)[
        0, src - 1 if not generated else source_length + len(generated) - 1
      ].numpy()
      logits[[0, 100, 101, 103]] = -np.inf
      token = int(np.argmax(logits))
      generated.append(token)
      if token == 102:
        break
    length = int(decoded["lengths"][b])
    assert np.asarray(decoded["tokens"][b, : len(generated)]).tolist() == generated
    assert length == (len(generated) - 1 if generated[-1] == 102 else len(generated))


# --- beam search ----------------------------------------------------------------------------------


def _markov(vocab, length, seed):
  """A toy decoder whose next-token scores depend on the step and the sum of the tokens so far (a
  state that must follow its beam)."""
  rng = np.random.default_rng(seed)
  return rng.normal(size=(2, vocab)).astype(np.float32) * 2, rng.normal(size=(length + 1, vocab, vocab)).astype(
    np.float32
  ) * 2


def _log_softmax(x):
  return x - x.max() - np.log(np.exp(x - x.max()).sum())


def _brute_force(first, table, s: DecodeSettings):
  """The best hypothesis among all sequences that the settings allow, scored as beam search scores."""
  vocab, best = first.shape[0], (-np.inf, None)
  for length in range(1, s.max_length + 1):
    for seq in itertools.product(range(vocab), repeat=length):
      ends = seq[-1] == s.end_id
      if s.end_id in seq[:-1] or (not ends and length < s.max_length) or any(t in s.banned_ids for t in seq):
        continue
      if ends and length - 1 < s.min_length:
        continue
      n = s.no_repeat_ngram
      if n and len({seq[i : i + n] for i in range(length - n + 1)}) < length - n + 1:
        continue
      logp, total, state = _log_softmax(first), 0.0, 0
      for t, token in enumerate(seq):
        total += logp[token]
        state = (state + token) % vocab
        logp = _log_softmax(table[t + 1, state])
      score = total / length**s.length_penalty
      if score > best[0] + 1e-6:
        best = (score, seq)
  return best


def _beam_search(first, table, s):
  vocab = first.shape[1]

  def step_fn(tokens, state, step):
    state = (state + tokens) % vocab
    return jnp.asarray(table)[step + 1, state], state

  return jax.jit(lambda f: beam_search(f, step_fn, jnp.zeros((f.shape[0],), jnp.int32), s))(jnp.asarray(first))


@pytest.mark.parametrize(
  "length_penalty,min_length,ngram,banned",
  [(1.0, 0, 0, ()), (0.0, 1, 0, (3,)), (2.0, 0, 1, ()), (-0.5, 2, 2, ()), (1.3, 1, 2, (2,))],
)
def test_beam_search_finds_what_brute_force_finds(length_penalty, min_length, ngram, banned):
  vocab, length = 4, 3
  s = DecodeSettings(
    beam_size=vocab**length,
    max_length=length,
    min_length=min_length,
    end_id=0,
    length_penalty=length_penalty,
    no_repeat_ngram=ngram,
    banned_ids=banned,
  )
  for seed in range(3):
    first, table = _markov(vocab, length, seed)
    tokens, lengths, scores = _beam_search(first, table, s)
    for b in range(2):
      best_score, best = _brute_force(first[b], table, s)
      assert tuple(np.asarray(tokens[b, : min(int(lengths[b]) + 1, length)]).tolist()) == best
      np.testing.assert_allclose(float(scores[b]), best_score, rtol=1e-5)


def test_one_beam_is_greedy():
  first, table = _markov(6, 5, 0)
  s = DecodeSettings(beam_size=1, max_length=5, end_id=0)
  tokens, lengths, _ = _beam_search(first, table, s)
  for b in range(2):
    logits, state, greedy = first[b], 0, []
    for t in range(5):
      token = int(np.argmax(logits))
      greedy.append(token)
      if token == 0:
        break
      state = (state + token) % 6
      logits = table[t + 1, state]
    assert np.asarray(tokens[b, : len(greedy)]).tolist() == greedy


# --- metrics --------------------------------------------------------------------------------------


def test_bleu_and_rouge_match_the_libraries_documented_examples():
  # sacrebleu's README: BLEU 48.53 for these three hypotheses against the first reference stream...
  hypotheses = ["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]
  references = ["The dog bit the man.", "It was not unexpected.", "The man bit him first."]
  assert generation_metrics.bleu4(hypotheses, references) == pytest.approx(
    __import__("sacrebleu").corpus_bleu(hypotheses, [references]).score
  )
  # rouge-score's README: "The quick brown fox jumps over the lazy dog" vs "The quick brown dog jumps
  # on the log." has ROUGE-1 precision 0.75, recall 0.6667 (F1 0.7059) and ROUGE-L F1 0.5882.
  scores = generation_metrics.rouge(
    ["The quick brown dog jumps on the log."], ["The quick brown fox jumps over the lazy dog"], ("rouge1", "rougeL")
  )
  assert scores["rouge1"] == pytest.approx(70.588, abs=1e-3) and scores["rougeL"] == pytest.approx(58.824, abs=1e-3)
  # two streams, as sacrebleu's README, to pin the corpus-level number
  import sacrebleu

  two = sacrebleu.corpus_bleu(
    hypotheses, [references, ["The dog had bit the man.", "No one was surprised.", "The man had bitten the dog."]]
  )
  assert round(two.score, 2) == 48.53


@needs_wordnet
def test_meteor_matches_nltks_documented_example():
  # NLTK's meteor_score docstring: 0.6944 for hypothesis1 against reference1.
  hypothesis = "It is a guide to action which ensures that the military always obeys the commands of the party"
  reference = "It is a guide to action that ensures that the military will forever heed Party commands"
  assert generation_metrics.meteor([hypothesis], [reference]) == pytest.approx(69.44, abs=0.01)


def test_meteor_without_wordnet_says_what_to_install(tmp_path):
  with pytest.raises(UserError, match="wordnet-base"):
    generation_metrics.meteor(["a b"], ["a b"], str(tmp_path))


# --- runs -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def qg_dir(tmp_path_factory, sentences):
  """SQuAD 1.1 files from real sentences: the answer is the sentence's first word, the question asks for it."""
  d = tmp_path_factory.mktemp("qg")
  paragraphs = [
    {
      "context": s,
      "qas": [
        {
          "id": f"q{i}",
          "question": f"Which word comes before {s.split()[1]}?",
          "answers": [{"text": s.split()[0], "answer_start": 0}],
        }
      ],
    }
    for i, s in enumerate(sentences[:48])
    if len(s.split()) > 2
  ]
  for name in ("train-v1.1.json", "dev-v1.1.json"):
    (d / name).write_text(json.dumps({"version": "1.1", "data": [{"title": "docs", "paragraphs": paragraphs}]}))
  return str(d)


@pytest.fixture(scope="session")
def summary_dir(tmp_path_factory, sentences):
  """Line files: "good : <sentence>" -> "it is good", "bad : <sentence>" -> "it is bad"."""
  d = tmp_path_factory.mktemp("summaries")
  rows = [("good" if i % 2 else "bad", s) for i, s in enumerate(sentences[:48])]
  for split in ("train", "dev"):
    (d / f"{split}.source").write_text("".join(f"{word} : {s}\n" for word, s in rows))
    (d / f"{split}.target").write_text("".join(f"it is {word}\n" for word, _ in rows))
  return str(d)


@needs_wordnet
def test_question_generation_and_summarisation_runs_are_scored_evaluated_and_exported(
  tiny_mlm_teacher, qg_dir, summary_dir, tmp_path
):
  qg_run, sum_run = str(tmp_path / "qg"), str(tmp_path / "sum")
  _, qg = build_finetuning(
    seq2seq_config(tiny_mlm_teacher, "qg", qg_dir, **{"seq2seq.qg_context": "sentence"}), qg_run
  ).run()
  _, summary = build_finetuning(
    seq2seq_config(
      tiny_mlm_teacher, "cnndm", summary_dir, epochs=6, **{"optimizer.lr": 3e-3, "seq2seq.no_repeat_ngram": 2}
    ),
    sum_run,
  ).run()
  assert {"dev/bleu4", "dev/meteor", "dev/rougeL"} <= set(qg)
  assert {"dev/rouge1", "dev/rouge2", "dev/rougeL"} <= set(summary)
  # The random 2-layer model learns the summaries' form, "it is" + a word + the end, from 36 steps
  # (whether that word is right takes a pre-trained encoder: the README's demo).
  predictions = json.load(open(os.path.join(sum_run, "dev_predictions.json")))
  assert len(predictions) == 48 and set(predictions.values()) <= {"it is good", "it is bad"}
  assert summary["dev/rouge1"] >= 83.3
  assert os.path.isfile(os.path.join(qg_run, "dev_predictions.json"))

  # The batch evaluation: both runs (and a different mesh) give the runs' own scores.
  rows = evaluate_runs([qg_run, sum_run], str(tmp_path / "eval"), mesh=parallel.make_mesh(4, 2), batch_size=8)
  by_run = {r["run"]: r for r in rows}
  assert by_run[sum_run]["rouge1"] == pytest.approx(summary["dev/rouge1"], abs=1e-6)
  assert by_run[qg_run]["bleu4"] == pytest.approx(qg["dev/bleu4"], abs=1e-6)
  assert os.path.isfile(os.path.join(tmp_path, "eval", "sum", "step_36", "dev_predictions.json"))

  # Export: transformers' BertForMaskedLM with the mask of tasks/seq2seq.py gives our logits.
  out = str(tmp_path / "export")
  config, head = runs.export_run(sum_run, out)
  layout = json.load(open(os.path.join(out, "seq2seq.json")))
  assert (layout["source_length"], layout["target_length"]) == (28, 12)
  torch_model = transformers.BertForMaskedLM.from_pretrained(out).eval()
  params, tokenizer = runs.read_run(sum_run)[1:3]
  features, _ = get_task("cnndm").prepare("dev", seq2seq_config(out, "cnndm", summary_dir), tokenizer)
  batch = {k: jnp.asarray(features[:4][k]) for k in ("input_ids", "attention_mask", "token_type_ids")}
  ours = np.asarray(Seq2SeqLM(config, head["target_length"]).apply({"params": params}, **batch))
  theirs = _hf_logits(torch_model, batch, 40 - 12).numpy()
  np.testing.assert_allclose(ours[:, 1:], theirs[:, 28:], atol=2e-4)  # the target slots


def test_a_longer_total_length_repeats_the_position_table(tiny_mlm_teacher, summary_dir, tmp_path):
  run = build_finetuning(seq2seq_config(tiny_mlm_teacher, "cnndm", summary_dir, max_seq_length=80), str(tmp_path / "w"))
  assert run.step.encoder_config.max_position_embeddings == 80  # the tiny teacher has 64
  table = np.asarray(run.pretrained["encoder"]["embeddings"]["position_embeddings"]["embedding"])
  np.testing.assert_array_equal(table[64:], table[:16])


def test_bad_seq2seq_inputs_are_refused(tiny_teacher, summary_dir, tmp_path):
  with pytest.raises(UserError, match="target_length"):
    build_finetuning(
      seq2seq_config(tiny_teacher, "cnndm", summary_dir, **{"seq2seq.target_length": 39}), str(tmp_path / "a")
    )
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "train.source").write_text("a\nb\n")
  (tmp_path / "d" / "train.target").write_text("a\n")
  with pytest.raises(UserError, match="must pair line by line"):
    build_finetuning(seq2seq_config(tiny_teacher, "xsum", str(tmp_path / "d")), str(tmp_path / "b"))
  (tmp_path / "e").mkdir()
  (tmp_path / "e" / "train.jsonl").write_text('{"document": "x"}\n')
  with pytest.raises(UserError, match="needs the fields"):
    build_finetuning(seq2seq_config(tiny_teacher, "xsum", str(tmp_path / "e")), str(tmp_path / "c"))
  with pytest.raises(UserError, match="neither"):
    build_finetuning(seq2seq_config(tiny_teacher, "cnndm", str(tmp_path)), str(tmp_path / "f"))
