"""Teachers of other architectures than BERT's (`models.config.MODEL_TYPES`): each distilled by
MiniLM's relations into a student of its own architecture (started from its layers) and into a
BERT-shaped student on its vocabulary; a student that cannot be either is one line before any work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from minilm_jax import runs
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError

# MiniLM's attention and value relations; MiniLMv2's Q-Q/K-K/V-V with 8 relation heads where the
# models have 4 attention heads; the teacher's first layer rather than its last.
OBJECTIVES = {
  "minilm": {},
  "minilmv2_8_heads": {"loss.relations": "qq,kk,vv", "loss.num_relation_heads": 8},
  "first_teacher_layer": {"teacher.layer": 0},
}
# A student of the teacher's own architecture from its layers (ETD: uniform selection and random
# width extraction), and a BERT-shaped one on its vocabulary.
STUDENTS = {
  "own_family_etd": {"student.init": "etd", "etd.method": "rand", "student.num_layers": 1},
  "bert_shaped": {"student.model_type": "bert"},
}


# Each teacher's fixture and its Hugging Face model type.
TEACHERS = {
  "mpnet": "tiny_mpnet_teacher",
  "deberta-v2": "tiny_deberta_teacher",
  "modernbert": "tiny_modernbert_teacher",
}


@pytest.mark.slow
@pytest.mark.parametrize("student", STUDENTS)
@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("model_type", TEACHERS)
def test_a_teacher_distils_into_its_own_architecture_and_a_bert_student(
  request, tiny_corpus, tmp_path, model_type, objective, student
):
  """Two steps of the train program's run from the teacher: every parameter finite, the student's
  record of the architecture it was asked for."""
  teacher = request.getfixturevalue(TEACHERS[model_type])
  overrides = {"num_steps": 2, "student.model_type": model_type, **OBJECTIVES[objective], **STUDENTS[student]}
  config = tiny_config(teacher, tiny_corpus, **overrides)
  state = build_distillation(config, str(tmp_path / "run")).run()
  assert int(state.step) == 2 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
  record = runs.read_record(str(tmp_path / "run"))
  assert record.encoder.model_type == config.student.model_type
  if student == "own_family_etd":  # its architecture's own parameters, taken from the teacher's
    own = {"mpnet": "relative_attention_bias", "deberta-v2": "relative_embeddings", "modernbert": "final_norm"}[
      model_type
    ]
    assert own in state.params and "token_type_embeddings" not in state.params["embeddings"]
  if objective == "minilm":  # exported in its family: transformers' class, our load of it the run's
    _check_export(str(tmp_path / "run"), str(tmp_path / "exported"), state.params)


def _check_export(workdir: str, out: str, params):
  import torch
  import transformers

  from minilm_jax.models import hf, layout
  from minilm_jax.models.encoder import Encoder

  config, _ = runs.export_run(workdir, out, sentence_transformers=True)
  model = transformers.AutoModel.from_pretrained(out, attn_implementation="eager").eval()
  assert type(model).__name__ == config.architecture.hf_architecture
  loaded = hf.load(out)
  pooler = "pooler/kernel" in {p.path for p in layout.rows(config.model_type)}  # DeBERTa's: none, as transformers'
  assert set(loaded.params) == set(params) - {"projection", "mlm_head"}
  for key, value in loaded.params.items():
    if key != "pooler" or pooler:
      jax.tree.map(np.testing.assert_array_equal, value, params[key])
  ids = np.asarray([[1, 7, 9, 12, 15, 2, 0, 0]])
  mask = (np.arange(8) < 6).astype(np.int64)[None]
  ours = Encoder(loaded.config).apply({"params": loaded.params}, ids, mask).last_hidden_state
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
  np.testing.assert_allclose(np.asarray(ours)[0, :6], theirs[0, :6], atol=1e-4)
  # sentence-transformers loads the folder and encodes as the run's student does.
  from sentence_transformers import SentenceTransformer

  from minilm_jax.devices import parallel
  from minilm_jax.evaluation.sentences import SentenceEncoder

  texts = ["a short sentence", "another, somewhat longer sentence of words", "the end"]
  embedded = SentenceTransformer(out, device="cpu").encode(texts)
  np.testing.assert_allclose(SentenceEncoder.load(workdir, parallel.make_mesh(1), 4, 32)(texts), embedded, atol=1e-5)


def test_a_student_that_cannot_learn_an_mpnet_teacher_is_one_line(tiny_mpnet_teacher, tiny_corpus, tmp_path):
  """ETD from a teacher of another architecture, a student of a third architecture, a vocabulary
  that is not the teacher's: each one line before any work."""
  cases = (
    ({"student.model_type": "bert", "student.init": "etd"}, "student.init=etd takes the teacher's layers"),
    ({"student.model_type": "roberta"}, "its architecture or BERT's: set .*student.model_type=mpnet"),
    ({"student.model_type": "mpnet", "student.vocab_size": 7}, "a student has its teacher's vocabulary"),
  )
  for overrides, message in cases:
    with pytest.raises(UserError, match=message):
      build_distillation(tiny_config(tiny_mpnet_teacher, tiny_corpus, **overrides), str(tmp_path / "w"))


@pytest.mark.parametrize("model_type", ["mpnet", "deberta-v2"])
def test_the_relations_read_the_content_queries_and_keys(request, model_type):
  """What MiniLM's relations read of a teacher whose attention adds relative-position terms (MPNet's
  bias, DeBERTa's c2p and p2c): each layer's queries and keys are its content projections of the
  layer's input, the same maps as BERT's, without the relative terms (docs/fidelity.md), while
  the layer's own attention does include them."""
  import jax.numpy as jnp

  from minilm_jax.models import hf
  from minilm_jax.models.attention import split_heads
  from minilm_jax.models.encoder import Encoder

  loaded = hf.load(request.getfixturevalue(TEACHERS[model_type]))
  ids = jnp.asarray([[1, 7, 9, 12, 15, 2]])
  out = Encoder(loaded.config).apply({"params": loaded.params}, ids, return_attention=True)
  layer = loaded.params["layer_1"]["attention"]
  for name, got in (("query", out.layers[1].q), ("key", out.layers[1].k)):
    projected = out.layers[0].hidden @ layer[name]["kernel"] + layer[name]["bias"]
    np.testing.assert_allclose(got, split_heads(projected, loaded.config.num_heads), atol=1e-5)
  q, k = out.layers[1].q, out.layers[1].k
  content = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / loaded.config.score_scale, axis=-1)
  assert not np.allclose(content, out.layers[1].attention, atol=1e-3)  # the relative terms are the model's


def test_a_modernbert_student_takes_each_layers_kind_and_its_first_layer_has_no_attention_norm(
  tiny_modernbert_teacher, tiny_corpus
):
  """ETD from ModernBERT's layers 2 and 4 (a sliding layer, then a global one): the student's first
  layer attends within the window and its second globally, as the layers they are taken from; its
  first layer has no norm before its attention (as every ModernBERT's), the second takes the
  teacher's; a random student attends as ModernBERT's of its depth."""
  from minilm_jax.distill import etd
  from minilm_jax.distill.step import student_config
  from minilm_jax.models import hf

  loaded = hf.load(tiny_modernbert_teacher)
  assert loaded.config.sliding_layers == (1, 2)
  overrides = {"student.model_type": "modernbert", "student.init": "etd", "etd.layers": "2,4"}
  overrides |= {"student.hidden_size": 32, "student.intermediate_size": 64}
  config = tiny_config(tiny_modernbert_teacher, tiny_corpus, **overrides)
  student = student_config(config, loaded.config)
  assert student.sliding_layers == (0,) and student.local_window == loaded.config.local_window
  indices = etd.random_indices(loaded.config, student, seed=0)
  params = etd.extract(loaded.params, loaded.config, student, indices, config.etd.layers)
  assert "LayerNorm" not in params["layer_0"]["attention"]
  np.testing.assert_array_equal(
    params["layer_1"]["attention"]["LayerNorm"]["scale"], loaded.params["layer_3"]["attention"]["LayerNorm"]["scale"]
  )
  config = tiny_config(
    tiny_modernbert_teacher, tiny_corpus, **{"student.model_type": "modernbert", "student.num_layers": 4}
  )
  assert student_config(config, loaded.config).sliding_layers == (1, 2)


def test_the_relations_read_modernberts_rotated_queries_and_keys(tiny_modernbert_teacher):
  """What MiniLM's relations read of a ModernBERT: each layer's queries and keys after the rotation
  by position, so that on a global layer the attention relation is the model's own attention
  (docs/fidelity.md), where the unrotated projections of the normed layer input are not."""
  import jax.numpy as jnp

  from minilm_jax.models import hf, modernbert
  from minilm_jax.models.attention import split_heads
  from minilm_jax.models.encoder import Encoder

  loaded = hf.load(tiny_modernbert_teacher)
  c = loaded.config
  assert 3 not in c.sliding_layers
  ids = jnp.asarray([[1, 7, 9, 12, 15, 2]])
  out = Encoder(c).apply({"params": loaded.params}, ids, return_attention=True)
  layer = loaded.params["layer_3"]["attention"]
  normed = jax.nn.standardize(out.layers[2].hidden, epsilon=c.layer_norm_eps) * layer["LayerNorm"]["scale"]
  rotation = modernbert.rotation(jnp.arange(6)[None], c.head_dim, c.rope_theta)
  for name, got in (("query", out.layers[3].q), ("key", out.layers[3].k)):
    projected = (normed @ layer[name]["kernel"]).reshape(1, 6, c.num_heads, c.head_dim)
    np.testing.assert_allclose(got, modernbert.rotate(projected, rotation).transpose(0, 2, 1, 3), atol=1e-5)
    unrotated = split_heads(normed @ layer[name]["kernel"], c.num_heads)
    assert not np.allclose(got, unrotated, atol=1e-3)
  q, k = out.layers[3].q, out.layers[3].k
  relation = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(c.head_dim), axis=-1)
  np.testing.assert_allclose(relation, out.layers[3].attention, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", TEACHERS)
def test_a_teacher_of_each_architecture_fine_tunes_and_answers_spans(
  request, sst2_dir, squad_dir, tmp_path, model_type
):
  """`finetune --config.init=<a DeBERTa, MPNet or ModernBERT folder>`: sentence classification (its
  tokenizer's own special tokens around the sentence) and SQuAD spans (the pair inputs its tokenizer
  writes), each a finite dev score; each exported as transformers' task model of the architecture,
  whose logits are ours, where transformers' head computes ours (ModernBERT's norms the pooled
  vector: its task heads are refused in one line and the encoder exports alone)."""
  from conftest import finetune_config
  from minilm_jax.finetuning.run import build_finetuning

  teacher = request.getfixturevalue(TEACHERS[model_type])
  _, results = build_finetuning(finetune_config(teacher, "sst2", sst2_dir, epochs=1), str(tmp_path / "sst2")).run()
  assert 0.0 <= results["dev/accuracy"] <= 1.0
  config = finetune_config(teacher, "squad2", squad_dir, max_seq_length=24, doc_stride=8, epochs=1)
  _, results = build_finetuning(config, str(tmp_path / "squad")).run()
  assert np.isfinite(results["dev/f1"])
  for task, auto, texts in (
    ("sst2", "AutoModelForSequenceClassification", (["Return the path.", "Something else entirely, at length."],)),
    ("squad", "AutoModelForQuestionAnswering", (["Which word comes first?"], ["Return the value."])),
  ):
    out = str(tmp_path / f"{task}_exported")
    if model_type == "modernbert":
      with pytest.raises(UserError, match="exporting a modernbert .* head is not supported"):
        runs.export_run(str(tmp_path / task), out)
      continue
    runs.export_run(str(tmp_path / task), out)
    assert _exported_logits(str(tmp_path / task), out, auto, texts) < 1e-4


def _exported_logits(workdir: str, out: str, auto: str, texts: tuple) -> float:
  """The largest difference between a run's task model's logits and those of transformers' task
  model of its export (of the architecture's own class), on `texts`."""
  import torch
  import transformers

  from minilm_jax.models.heads import task_model

  config, params, tokenizer, head = runs.read_run(workdir)[:4]
  batch = tokenizer(*texts, padding=True, return_tensors="np")
  ids, mask = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
  ours = jax.jit(task_model(config, head).apply)({"params": params}, ids, mask)  # jitted: one compile, not one per op
  model = getattr(transformers, auto).from_pretrained(out).eval()
  assert type(model).__name__.startswith(config.architecture.hf_architecture.removesuffix("Model"))
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(batch["input_ids"]), attention_mask=torch.tensor(batch["attention_mask"]))
  theirs = (theirs.logits,) if "logits" in theirs else (theirs.start_logits, theirs.end_logits)
  ours = ours if isinstance(ours, tuple) else (ours,)
  return max(float(np.abs(np.asarray(o) - t.numpy()).max()) for o, t in zip(ours, theirs))


@pytest.mark.slow
@pytest.mark.parametrize("model_type", TEACHERS)
def test_bench_distill_times_a_teacher_of_each_architecture_against_transformers(request, model_type):
  """`bench distill --teacher <folder>` of a DeBERTa or MPNet teacher: our step and transformers'
  (the same architecture's teacher and student, their queries, keys and values captured by hooks)
  in one process, every column filled."""
  from minilm_jax.benchmarks import distill

  teacher = request.getfixturevalue(TEACHERS[model_type])
  settings = distill.Settings(
    teacher=teacher, students=["1x16x4"], batch_size=2, seq_lens=[8], repeats=1, train_steps=0, peers=("eager",)
  )
  (row,) = distill.run(settings)
  assert row["ours_tokens_per_s"] > 0 and row["torch_eager_tokens_per_s"] > 0 and row["ratio_vs_eager"] > 0
