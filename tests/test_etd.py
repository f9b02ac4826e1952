"""ETD: extraction with hidden consistency, layer selection, Taylor importance against finite differences."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import traverse_util

from minilm_jax.distill import etd, importance
from minilm_jax.errors import UserError
from minilm_jax.models import hf
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params

TEACHER = EncoderConfig(
  vocab_size=60,
  hidden_size=24,
  num_layers=4,
  num_heads=4,
  intermediate_size=40,
  max_position_embeddings=32,
  hidden_dropout=0.0,
  attention_dropout=0.0,
)
STUDENT = TEACHER.replace(hidden_size=12, intermediate_size=16, num_layers=2)


@pytest.fixture(scope="module")
def teacher_params():
  params = init_params(TEACHER, jax.random.key(0))
  # Random init leaves LayerNorms at identity and biases at 0: perturb everything so indices matter.
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def _ids(seed=0, shape=(2, 7)):
  return jnp.asarray(np.random.default_rng(seed).integers(3, 60, shape))


@pytest.mark.parametrize(
  "teacher_layers,student_layers,expected",
  [(12, 6, [1, 3, 5, 7, 9, 11]), (12, 4, [2, 5, 8, 11]), (12, 3, [3, 7, 11]), (6, 3, [1, 3, 5])],
)
def test_uniform_layer_mapping(teacher_layers, student_layers, expected):
  assert etd.select_layers(teacher_layers, student_layers) == expected  # every L/M-th, ending at the last


def test_top_and_bottom_layer_selection():
  assert etd.select_layers(12, 4, "top") == [8, 9, 10, 11]
  assert etd.select_layers(12, 4, "bottom") == [0, 1, 2, 3]


def test_listed_layer_selection():
  """etd.layers lists the teacher's layers, 1-based: "1,2,6" keeps the first two and the last of six."""
  assert etd.select_layers(6, 3, "1,2,6") == [0, 1, 5]
  for listed in ("1,2", "2,1,6", "1,1,6", "0,2,6", "1,2,7", "1,two,6"):
    with pytest.raises(UserError, match=f"etd.layers='{listed}': list 3 of the teacher's layers 1..6, ascending"):
      etd.select_layers(6, 3, listed)
  with pytest.raises(UserError, match="unknown layer selection 'middle'.*or list the teacher's layers"):
    etd.select_layers(6, 3, "middle")


def test_full_width_extraction_reproduces_the_teacher(teacher_params):
  full = {
    "hidden": np.arange(24),
    "layers": [
      {"hidden": np.arange(24), "heads": np.tile(np.arange(6), (4, 1)), "ffn": np.arange(40)} for _ in range(4)
    ],
  }
  params = etd.extract(teacher_params, TEACHER, TEACHER, full)
  jax.tree.map(np.testing.assert_array_equal, params, jax.device_get(teacher_params))
  apply = jax.jit(Encoder(TEACHER).apply)  # one program for both, not op by op
  a = apply({"params": teacher_params}, _ids()).last_hidden_state
  b = apply({"params": params}, _ids()).last_hidden_state
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_hidden_consistency_puts_one_index_set_in_every_tensor(teacher_params):
  indices = etd.random_indices(TEACHER, STUDENT, seed=3)
  hidden = indices["hidden"]
  assert len(hidden) == 12 and len(set(hidden)) == 12
  student = traverse_util.flatten_dict(etd.extract(teacher_params, TEACHER, STUDENT, indices), sep="/")
  teacher = traverse_util.flatten_dict(jax.device_get(teacher_params), sep="/")
  for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
    np.testing.assert_array_equal(
      student[f"embeddings/{name}/embedding"], teacher[f"embeddings/{name}/embedding"][:, hidden]
    )
  for s, t in enumerate(etd.select_layers(4, 2)):
    layer = indices["layers"][t]
    cols = (np.arange(4)[:, None] * 6 + layer["heads"]).ravel()
    for proj in ("query", "key", "value"):  # input rows: the hidden set; columns: the kept head neurons
      np.testing.assert_array_equal(
        student[f"layer_{s}/attention/{proj}/kernel"],
        teacher[f"layer_{t}/attention/{proj}/kernel"][np.ix_(hidden, cols)],
      )
    np.testing.assert_array_equal(
      student[f"layer_{s}/attention/output/kernel"], teacher[f"layer_{t}/attention/output/kernel"][np.ix_(cols, hidden)]
    )
    np.testing.assert_array_equal(
      student[f"layer_{s}/intermediate/kernel"], teacher[f"layer_{t}/intermediate/kernel"][np.ix_(hidden, layer["ffn"])]
    )
    np.testing.assert_array_equal(
      student[f"layer_{s}/output/kernel"], teacher[f"layer_{t}/output/kernel"][np.ix_(layer["ffn"], hidden)]
    )
    for name in ("attention/LayerNorm/scale", "attention/LayerNorm/bias", "output_LayerNorm/scale", "output/bias"):
      np.testing.assert_array_equal(student[f"layer_{s}/{name}"], teacher[f"layer_{t}/{name}"][hidden])
  np.testing.assert_array_equal(student["embeddings/LayerNorm/scale"], teacher["embeddings/LayerNorm/scale"][hidden])
  # The extracted student has exactly the student architecture's shapes.
  expected = traverse_util.flatten_dict(jax.eval_shape(lambda: init_params(STUDENT, jax.random.key(0))), sep="/")
  assert {k: v.shape for k, v in student.items()} == {k: v.shape for k, v in expected.items()}


def test_without_hidden_consistency_layers_pick_their_own():
  indices = etd.random_indices(TEACHER, STUDENT, seed=3, hidden_consistency=False)
  sets = [tuple(layer["hidden"]) for layer in indices["layers"]]
  assert len(set(sets)) > 1


def test_etd_rand_is_reproducible_from_its_seed():
  a, b, c = (etd.random_indices(TEACHER, STUDENT, seed) for seed in (5, 5, 6))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert not np.array_equal(a["hidden"], c["hidden"])


@pytest.mark.slow
def test_taylor_scores_equal_finite_differences(teacher_params):
  """I = sum over sentences x of |sum_t a_t * dL(x)/da_t| (ETD equations 5-8), L(x) the sentence's
  own masked-LM loss, with dL(x)/da_t estimated by central differences under a perturbation of one
  neuron at one token of one sentence."""
  config = TEACHER.replace(num_layers=2)
  params = {k: v for k, v in teacher_params.items() if not k.startswith(("layer_2", "layer_3"))}
  from minilm_jax.models.heads import MaskedLM

  model = MaskedLM(config)
  ids = _ids(4, (2, 5))
  mask = jnp.ones_like(ids)
  variables = model.init(jax.random.key(2), ids, mask)
  mlm = {k: v for k, v in variables["params"].items() if k != "encoder"}
  masked, weights = importance.mlm_mask(np.asarray(ids), np.ones((2, 5)), ({0}, 1), 60, np.random.default_rng(0))
  weights[:, :2] = 1.0  # make sure some positions are predicted
  weights[1, 2:] = 1.0  # and a different number in each sentence: each has its own mean
  batch = {
    "input_ids": np.asarray(ids, np.int32),
    "attention_mask": np.ones((2, 5), np.int32),
    "token_type_ids": np.zeros((2, 5), np.int32),
    "masked_ids": masked,
    "weights": weights,
  }
  scores = importance.taylor_scores(config, params, mlm, [batch])

  full = {"encoder": params, **mlm}
  zeros = jax.tree.map(jnp.zeros_like, variables["perturbations"])
  _, activations = model.apply(
    {"params": full, "perturbations": zeros},
    batch["masked_ids"],
    batch["attention_mask"],
    batch["token_type_ids"],
    mutable=["intermediates"],
  )
  activations = activations["intermediates"]["encoder"]

  def loss(p, b):
    """Sentence b's own loss: the mean cross-entropy of its masked tokens, in numpy."""
    logits = model.apply(
      {"params": full, "perturbations": p}, batch["masked_ids"], batch["attention_mask"], batch["token_type_ids"]
    )
    logits = np.asarray(logits[b], np.float64)
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    ce = -log_probs[np.arange(5), batch["input_ids"][b]]
    return float((ce * batch["weights"][b]).sum() / batch["weights"][b].sum())

  eps = 1e-2
  for layer, path, neuron, score in [
    (1, ("attention", "heads"), 7, scores["layers"][1]["heads"].ravel()[7]),
    (0, ("ffn",), 11, scores["layers"][0]["ffn"][11]),
    (1, ("attention", "input"), 3, scores["layers"][1]["hidden"][3]),
  ]:
    estimate, sum_of_abs = 0.0, 0.0
    for b in range(2):
      change = 0.0  # the first-order change of sentence b's loss when the neuron is removed
      for t in range(5):

        def shifted(delta, layer=layer, path=path, b=b, t=t, neuron=neuron):
          p = jax.tree.map(lambda x: x, zeros)
          node = p["encoder"][f"layer_{layer}"]
          for key in path[:-1]:
            node = node[key]
          node[path[-1]] = node[path[-1]].at[b, t, neuron].set(delta)
          return p

        grad = (loss(shifted(eps), b) - loss(shifted(-eps), b)) / (2 * eps)
        node = activations[f"layer_{layer}"]
        for key in path:
          node = node[key]
        change += float(node[0][b, t, neuron]) * grad
        sum_of_abs += abs(float(node[0][b, t, neuron]) * grad)
      estimate += abs(change)
    np.testing.assert_allclose(score, estimate, rtol=2e-2, atol=1e-6)
    assert sum_of_abs > estimate * 1.05  # the per-token absolute values would score another number
  # The hidden score of a dimension is the sum of its MHA-input scores over layers.
  np.testing.assert_allclose(scores["hidden"], scores["layers"][0]["hidden"] + scores["layers"][1]["hidden"], rtol=1e-6)


def _ranked_scores():
  """Scores in known order: hidden falling with position, every other type rising."""
  return {
    "hidden": np.arange(24.0)[::-1],
    "layers": [
      {"hidden": np.arange(24.0), "heads": np.tile(np.arange(6.0), (4, 1)), "ffn": np.arange(40.0)} for _ in range(4)
    ],
  }


def test_top_indices_keep_the_highest_scores():
  scores = _ranked_scores()
  indices = etd.top_indices(scores, STUDENT)
  np.testing.assert_array_equal(indices["hidden"], np.arange(12))
  np.testing.assert_array_equal(indices["layers"][0]["ffn"], np.arange(24, 40))
  np.testing.assert_array_equal(indices["layers"][0]["heads"][2], np.arange(3, 6))
  per_layer = etd.top_indices(scores, STUDENT, hidden_consistency=False)
  np.testing.assert_array_equal(per_layer["layers"][0]["hidden"], np.arange(12, 24))


def test_reverse_keeps_the_least_important_of_the_types_it_names():
  scores = _ranked_scores()
  top = etd.top_indices(scores, STUDENT)
  rev_ffn = etd.top_indices(scores, STUDENT, reverse=etd.reversed_types("ffn"))
  np.testing.assert_array_equal(rev_ffn["layers"][0]["ffn"], np.arange(16))  # the 16 lowest of 40
  np.testing.assert_array_equal(rev_ffn["hidden"], top["hidden"])
  np.testing.assert_array_equal(rev_ffn["layers"][0]["heads"], top["layers"][0]["heads"])
  rev_all = etd.top_indices(scores, STUDENT, reverse=etd.reversed_types("all"))
  np.testing.assert_array_equal(rev_all["hidden"], np.arange(12, 24))
  np.testing.assert_array_equal(rev_all["layers"][1]["heads"][0], np.arange(3))
  assert etd.reversed_types("head, hidden") == {"head", "hidden"} and etd.reversed_types("") == set()
  with pytest.raises(UserError, match=r"etd.reverse='ffn,attn' names \['attn'\]: use all, or a comma list"):
    etd.reversed_types("ffn,attn")


def test_etd_config_variants_of_table_2(tmp_path):
  from conftest import ROOT, load_config_module

  module = load_config_module(os.path.join(ROOT, "configs", "ablations", "etd.py"))
  for kind in ("ffn", "head", "hidden", "all"):
    c = module.get_config(f"etd_impt_rev_{kind}")
    assert (c.etd.method, c.etd.reverse) == ("impt", kind)
    etd.reversed_types(c.etd.reverse)
  assert module.get_config("etd_impt").etd.reverse == ""


def test_first_sentences_are_sentences():
  from minilm_jax.data.corpus import split_sentences

  text = 'Return the value. See e.g. the docs! "Quoted." Then (3 more)? ok\nNext line.'
  assert split_sentences(text) == [
    "Return the value.",
    "See e.g. the docs!",
    '"Quoted."',
    "Then (3 more)? ok\nNext line.",
  ]


def test_mlm_head_loads_from_transformers(tmp_path):
  torch.manual_seed(0)
  config = transformers.BertConfig(
    vocab_size=60,
    hidden_size=24,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=40,
    max_position_embeddings=32,
  )
  model = transformers.BertForMaskedLM(config).eval()
  model.save_pretrained(str(tmp_path))
  encoder_config, encoder_params, _, _, head = hf.load(str(tmp_path), mlm_head=True)[:5]
  from minilm_jax.models.heads import MaskedLM

  ids = _ids(1, (2, 6))
  ours = MaskedLM(encoder_config).apply({"params": {"encoder": encoder_params, **head}}, ids, jnp.ones_like(ids))
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(np.asarray(ids))).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)
  transformers.BertModel(config).save_pretrained(str(tmp_path / "bare"))  # an encoder without its MLM head
  assert hf.load(str(tmp_path / "bare"), mlm_head=True).mlm_head is None


def test_clear_errors():
  with pytest.raises(UserError, match="wider than its teacher"):
    etd.check_extractable(STUDENT, TEACHER)
  with pytest.raises(UserError, match="keeps the teacher's 4 heads"):
    etd.check_extractable(TEACHER, STUDENT.replace(num_heads=2))
  with pytest.raises(UserError, match="needs the student's depth"):
    etd.select_layers(12, 5)
  with pytest.raises(UserError, match="cannot be taken from a 6-layer teacher"):
    etd.select_layers(6, 8, "top")


def test_distillation_starts_from_the_extracted_student(tiny_teacher, tiny_corpus, tmp_path):
  """student.init=etd with num_steps=0 writes the ETD-Rand student as a run: the extraction on its own."""
  from conftest import tiny_config
  from minilm_jax import runs
  from minilm_jax.distill.trainer import build_distillation

  config = tiny_config(tiny_teacher, tiny_corpus, num_steps=0, **{"student.init": "etd", "etd.seed": 7})
  build_distillation(config, str(tmp_path / "etd")).run()
  params = runs.read_run(str(tmp_path / "etd")).params
  teacher_config = hf.read_config(tiny_teacher)
  teacher_params = hf.load(tiny_teacher).params
  from minilm_jax.distill.step import student_config

  student = student_config(config, teacher_config)
  expected = etd.extract(
    jax.device_get(teacher_params), teacher_config, student, etd.random_indices(teacher_config, student, 7), "uniform"
  )
  jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_etd_impt_without_mlm_head_is_one_line_error(tiny_teacher, tiny_corpus, tmp_path):
  from conftest import tiny_config
  from minilm_jax.distill.trainer import build_distillation

  config = tiny_config(tiny_teacher, tiny_corpus, **{"student.init": "etd", "etd.method": "impt"})
  with pytest.raises(
    UserError, match="no masked-LM head, so ETD-Impt has no importance scores: use --config.etd.method=rand"
  ):
    build_distillation(config, str(tmp_path / "w"))


def test_etd_impt_end_to_end_with_an_mlm_teacher(tmp_path, tiny_corpus, tiny_mlm_teacher):
  """A teacher saved as BertForMaskedLM: ETD-Impt scores its neurons on the corpus and extracts the student."""
  from conftest import tiny_config
  from minilm_jax.distill.trainer import build_distillation

  run = build_distillation(
    tiny_config(
      tiny_mlm_teacher,
      tiny_corpus,
      num_steps=1,
      **{"student.init": "etd", "etd.method": "impt", "etd.num_sentences": 64, "student.num_layers": 1},
    ),
    str(tmp_path / "w"),
  )
  assert run.lone.start_params["layer_0"]["attention"]["query"]["kernel"].shape == (16, 16)
  run.run()
