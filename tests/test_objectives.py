"""Baseline objectives against independent numpy references; layer mappings; the trainer runs each."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import TEST_VOCAB_SIZE, tiny_config
from minilm_jax.devices import parallel
from minilm_jax.distill.step import LONE, DistillationStep, jit_step
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import Encoder, EncoderConfig, LayerOutput, init_params
from minilm_jax.training.train_state import ConstantRate
from minilm_jax.transfer import objectives, relations
from minilm_jax.transfer.objectives import Objective, Outputs, attention_score_mse, layer_pairs, masked_mse

MASK = np.array([[1] * 6, [1] * 4 + [0] * 2])


@pytest.mark.parametrize(
  "teacher,student,variant,expected",
  [
    (12, 6, "all", [(0, 1), (1, 3), (2, 5), (3, 7), (4, 9), (5, 11)]),
    (12, 4, "all", [(0, 2), (1, 5), (2, 8), (3, 11)]),
    (12, 3, "all", [(0, 3), (1, 7), (2, 11)]),
    (6, 3, "all", [(0, 1), (1, 3), (2, 5)]),
    (12, 3, "last", [(2, 11)]),
    (12, 3, "last_two", [(1, 7), (2, 11)]),
    (12, 3, "first_and_last", [(0, 3), (2, 11)]),
    (12, 6, "first_and_last", [(0, 1), (5, 11)]),
  ],
)
def test_uniform_layer_mappings(teacher, student, variant, expected):
  assert layer_pairs(teacher, student, variant) == expected


def test_layer_mappings_that_cannot_exist():
  with pytest.raises(UserError, match="no uniform layer mapping from a 12-layer teacher to a 5-layer student"):
    layer_pairs(12, 5, "all")
  with pytest.raises(UserError, match="needs a student of at least 2 layers"):
    layer_pairs(12, 1, "last_two")
  with pytest.raises(UserError, match="unknown loss.layer_map"):
    layer_pairs(12, 6, "middle")


def _layer(rng, heads, head_dim, length=6, batch=2):
  d = {n: rng.standard_normal((batch, heads, length, head_dim)).astype(np.float32) for n in "qkv"}
  d["hidden"] = rng.standard_normal((batch, length, heads * head_dim)).astype(np.float32)
  return d


def _lo(d):
  return LayerOutput(
    q=jnp.asarray(d["q"]), k=jnp.asarray(d["k"]), v=jnp.asarray(d["v"]), attention=None, hidden=jnp.asarray(d["hidden"])
  )


def _np_mse(s, t, mask):
  """Mean of squared errors over real tokens and features."""
  rows = mask.astype(bool)
  return float(((s[rows] - t[rows]) ** 2).mean())


def _np_score_mse(t, s, mask):
  total, count = 0.0, 0
  for b in range(mask.shape[0]):
    n = int(mask[b].sum())
    for h in range(t["q"].shape[1]):
      st = t["q"][b, h, :n] @ t["k"][b, h, :n].T / np.sqrt(t["q"].shape[-1])
      ss = s["q"][b, h, :n] @ s["k"][b, h, :n].T / np.sqrt(s["q"].shape[-1])
      total += ((st - ss) ** 2).sum()
      count += n * n
  return total / count


def _merge(x):
  b, h, l, k = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, l, h * k)


def test_mse_losses_match_numpy():
  rng = np.random.default_rng(0)
  t, s = _layer(rng, 4, 6), _layer(rng, 4, 3)
  w = rng.standard_normal((12, 24)).astype(np.float32)
  np.testing.assert_allclose(
    float(masked_mse(jnp.asarray(s["hidden"]) @ w, jnp.asarray(t["hidden"]), jnp.asarray(MASK))),
    _np_mse(s["hidden"] @ w, t["hidden"], MASK),
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    float(attention_score_mse(_lo(t), _lo(s), jnp.asarray(MASK))), _np_score_mse(t, s, MASK), rtol=1e-5
  )


def _objective(name, pairs, student_width=12):
  return Objective(name, tuple(pairs), ("qk", "vv"), 4, 0, 24, student_width)


@pytest.mark.parametrize("name", ["value_mse", "hidden_mse", "tinybert"])
def test_baseline_objectives_match_numpy(name):
  rng = np.random.default_rng(1)
  t, s = _layer(rng, 4, 6), _layer(rng, 4, 3)
  objective = _objective(name, [(0, 0)])
  projection = {
    k: {"kernel": jnp.asarray(rng.standard_normal(shape).astype(np.float32))}
    for k, shape in objective.projection_shapes().items()
  }
  terms = objective(Outputs([_lo(t)]), Outputs([_lo(s)]), {"attention_mask": jnp.asarray(MASK)}, projection)
  attention_kl = float(relations.minilm_loss(_lo(t), _lo(s), jnp.asarray(MASK), ("qk",), 4)["qk"])
  if name == "value_mse":
    w = np.asarray(projection["value"]["kernel"])
    assert terms["value_mse"] == pytest.approx(_np_mse(_merge(s["v"]) @ w, _merge(t["v"]), MASK), rel=1e-5)
    assert float(terms["qk"]) == pytest.approx(attention_kl, rel=1e-6)
  elif name == "hidden_mse":
    w = np.asarray(projection["hidden"]["kernel"])
    assert terms["hidden_mse"] == pytest.approx(_np_mse(s["hidden"] @ w, t["hidden"], MASK), rel=1e-5)
    assert float(terms["qk"]) == pytest.approx(attention_kl, rel=1e-6)
  else:
    w = np.asarray(projection["hidden"]["kernel"])
    assert set(terms) == {"attention_mse", "hidden_mse"}
    assert terms["attention_mse"] == pytest.approx(_np_score_mse(t, s, MASK), rel=1e-5)
    assert terms["hidden_mse"] == pytest.approx(_np_mse(s["hidden"] @ w, t["hidden"], MASK), rel=1e-5)


def test_layerwise_tinybert_matches_numpy():
  """TinyBERT's general distillation (its equations 7-9) written out in numpy: the embedding layer
  through W_e, then attention scores and hidden states (through one W_h) at teacher layer m * L / M."""
  rng = np.random.default_rng(4)
  teacher = [_layer(rng, 4, 6) for _ in range(4)]
  student = [_layer(rng, 4, 3) for _ in range(2)]
  t_emb, s_emb = (rng.standard_normal((2, 6, width)).astype(np.float32) for width in (24, 12))
  objective = _objective("tinybert_layerwise", layer_pairs(4, 2, "all"))
  assert objective.projection_shapes() == {"embeddings": (12, 24), "hidden": (12, 24)}
  projection = {
    k: {"kernel": jnp.asarray(rng.standard_normal((12, 24)).astype(np.float32))} for k in ("embeddings", "hidden")
  }
  terms = objective(
    Outputs([_lo(t) for t in teacher], None, jnp.asarray(t_emb)),
    Outputs([_lo(s) for s in student], None, jnp.asarray(s_emb)),
    {"attention_mask": jnp.asarray(MASK)},
    projection,
  )
  w_e, w_h = (np.asarray(projection[k]["kernel"]) for k in ("embeddings", "hidden"))
  expected = {"embeddings_mse": _np_mse(s_emb @ w_e, t_emb, MASK)}
  for m in (1, 2):  # student layer m (1-based) learns from teacher layer m * 4 / 2
    s, t = student[m - 1], teacher[m * 2 - 1]
    expected[f"attention_mse@{m - 1}"] = _np_score_mse(t, s, MASK)
    expected[f"hidden_mse@{m - 1}"] = _np_mse(s["hidden"] @ w_h, t["hidden"], MASK)
  assert set(terms) == set(expected)
  for name, value in expected.items():
    assert float(terms[name]) == pytest.approx(value, rel=1e-5), name


def test_hidden_states_match_numpy_at_every_pair_of_the_layer_map():
  """The hidden-state MSE alone, at student layer m and teacher layer m * L / M, through one W_h."""
  rng = np.random.default_rng(5)
  teacher = [_layer(rng, 4, 6) for _ in range(4)]
  student = [_layer(rng, 4, 3) for _ in range(2)]
  objective = _objective("hidden_states", layer_pairs(4, 2, "all"))
  assert objective.projection_shapes() == {"hidden": (12, 24)}
  projection = {"hidden": {"kernel": jnp.asarray(rng.standard_normal((12, 24)).astype(np.float32))}}
  terms = objective(
    Outputs([_lo(t) for t in teacher]),
    Outputs([_lo(s) for s in student]),
    {"attention_mask": jnp.asarray(MASK)},
    projection,
  )
  w_h = np.asarray(projection["hidden"]["kernel"])
  expected = {
    f"hidden_mse@{m - 1}": _np_mse(student[m - 1]["hidden"] @ w_h, teacher[2 * m - 1]["hidden"], MASK) for m in (1, 2)
  }
  assert set(terms) == set(expected)
  for name, value in expected.items():
    assert float(terms[name]) == pytest.approx(value, rel=1e-5), name


def test_same_width_needs_no_projection():
  assert _objective("hidden_mse", [(0, 0)], student_width=24).projection_shapes() == {}


def test_layer_to_layer_sums_minilm_at_every_pair():
  rng = np.random.default_rng(2)
  teacher = [_layer(rng, 4, 6) for _ in range(4)]
  student = [_layer(rng, 4, 3) for _ in range(2)]
  objective = _objective("layer_to_layer", layer_pairs(4, 2, "all"))
  terms = objective(
    Outputs([_lo(t) for t in teacher]), Outputs([_lo(s) for s in student]), {"attention_mask": jnp.asarray(MASK)}, {}
  )
  assert set(terms) == {"qk@0", "vv@0", "qk@1", "vv@1"}
  for s, t in ((0, 1), (1, 3)):
    expected = relations.minilm_loss(_lo(teacher[t]), _lo(student[s]), jnp.asarray(MASK), ("qk", "vv"), 4)
    assert float(terms[f"qk@{s}"]) == pytest.approx(float(expected["qk"]), rel=1e-6)


@pytest.mark.parametrize(
  "objective,layer_map",
  [
    ("layer_to_layer", "all"),
    ("value_mse", "last"),
    ("hidden_mse", "last"),
    ("tinybert", "last"),
    ("tinybert_layerwise", "last"),
    ("hidden_states", "all"),
  ],
)
@pytest.mark.slow
def test_trainer_runs_every_baseline(tiny_teacher, tiny_corpus, tmp_path, objective, layer_map):
  config = tiny_config(
    tiny_teacher, tiny_corpus, num_steps=2, **{"loss.objective": objective, "loss.layer_map": layer_map}
  )
  run = build_distillation(config, str(tmp_path / objective))
  state = run.run()
  if objective != "layer_to_layer":
    assert state.params["projection"]  # the student (16 wide) learns a map to the teacher's 32
  rows = [__import__("json").loads(l) for l in open(tmp_path / objective / "metrics.jsonl")]
  assert all(np.isfinite(r["loss"]) for r in rows)


def test_unknown_objective(tiny_teacher, tiny_corpus, tmp_path):
  with pytest.raises(UserError, match="unknown loss.objective 'kd'"):
    build_distillation(tiny_config(tiny_teacher, tiny_corpus, **{"loss.objective": "kd"}), str(tmp_path / "w"))


def test_soft_label_kl_matches_numpy():
  from minilm_jax.transfer.objectives import soft_label_kl

  rng = np.random.default_rng(3)
  t, s = rng.standard_normal((2, 5, 11)), rng.standard_normal((2, 5, 11))
  w = np.array([[1, 0, 1, 0, 0], [0, 0, 0, 1, 0]], np.float32)
  p = np.exp(t) / np.exp(t).sum(-1, keepdims=True)
  q = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
  expected = sum((p[b, l] * np.log(p[b, l] / q[b, l])).sum() for b, l in zip(*np.nonzero(w))) / w.sum()
  got = soft_label_kl(jnp.asarray(t, jnp.float32), jnp.asarray(s, jnp.float32), jnp.asarray(w))
  assert float(got) == pytest.approx(expected, rel=1e-5)
  assert float(soft_label_kl(jnp.asarray(t), jnp.asarray(t), jnp.asarray(w))) == pytest.approx(0.0, abs=1e-6)


def test_mlm_mask_rates_and_special_tokens():
  import jax

  from minilm_jax.transfer.objectives import mlm_mask

  ids = jnp.asarray(np.random.default_rng(0).integers(10, 1000, (64, 128)))
  ids = ids.at[:, 0].set(101).at[:, -1].set(102)
  mask = jnp.ones_like(ids).at[:, 100:].set(0)
  masked, weights = mlm_mask(jax.random.key(0), ids, mask, ((0, 101, 102, 103), 103), 1000)
  w = np.asarray(weights).astype(bool)
  assert not w[:, 0].any() and not w[:, 100:].any()  # never [CLS] or padding
  assert abs(w[:, 1:100].mean() - 0.15) < 0.01
  replaced = np.asarray(masked)[w] == 103
  assert abs(replaced.mean() - 0.8) < 0.03
  assert (np.asarray(masked)[~w] == np.asarray(ids)[~w]).all()


@pytest.mark.slow
def test_trainer_runs_mlm_soft_label_distillation(tmp_path, tiny_corpus, tiny_mlm_teacher, tiny_teacher):
  state = build_distillation(
    tiny_config(tiny_mlm_teacher, tiny_corpus, num_steps=2, **{"loss.objective": "mlm_kd"}), str(tmp_path / "kd")
  ).run()
  assert state.params["mlm_head"]["bias"].shape == (TEST_VOCAB_SIZE,)  # the teacher's vocabulary
  rows = [__import__("json").loads(l) for l in open(tmp_path / "kd" / "metrics.jsonl")]
  assert all(np.isfinite(r["loss_mlm_kd"]) and r["loss_mlm_kd"] > 0 for r in rows)
  with pytest.raises(UserError, match="needs the teacher's masked-LM head"):
    build_distillation(
      tiny_config(tiny_teacher, tiny_corpus, **{"loss.objective": "mlm_kd"}), str(tmp_path / "no_head")
    )


@pytest.mark.slow
def test_a_new_objective_is_one_registered_function(monkeypatch):
  """The README's "Extending" example: a registered function is an objective the sharded train step
  runs as it runs MiniLM's, with no change to the trainer; its loss is the attention KL alone."""
  monkeypatch.setattr(objectives, "DISTILLATION_OBJECTIVES", dict(objectives.DISTILLATION_OBJECTIVES))

  @objectives.register("attention_only")
  def attention_only(objective, teacher, student, batch, projection) -> dict:
    ((s, t),) = objective.pairs
    return relations.minilm_loss(
      teacher.layers[t],
      student.layers[s],
      batch["attention_mask"],
      ("qk",),
      objective.num_relation_heads,
      objective.query_chunk,
    )

  teacher_config = EncoderConfig(vocab_size=80, num_layers=2, hidden_size=32, num_heads=4, intermediate_size=64)
  student_config = teacher_config.replace(hidden_size=16, intermediate_size=32)
  mesh = parallel.make_mesh()
  metrics = {}
  for name in ("attention_only", "minilm"):
    objective = Objective(name, ((1, 1),), ("qk", "vv"), 4, 0, 32, 16)
    parts = DistillationStep(
      Encoder(teacher_config), Encoder(student_config), objective, optax.sgd, ConstantRate(np.float32(0.1))
    )
    step = jit_step({LONE: parts}, mesh)
    state = parts.fresh_state(jax.random.key(0))
    ids = jax.random.randint(jax.random.key(1), (8, 12), 1, 80)
    batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": jnp.zeros_like(ids)}
    teacher_params = init_params(teacher_config, jax.random.key(2))
    metrics[name] = jax.device_get(
      step(
        state,
        parallel.shard_batch(jax.device_get(batch), mesh),
        teacher_params,
        jax.random.key(3),
        {LONE: parts.schedule},
      )[1]
    )
  assert set(k for k in metrics["attention_only"] if k.startswith("loss_")) == {"loss_qk"}
  np.testing.assert_allclose(metrics["attention_only"]["loss"], metrics["minilm"]["loss_qk"], rtol=1e-6)
