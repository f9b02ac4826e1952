"""Sentence-embedding students: the embedding objective, the parameters an objective leaves
untrained (against autodiff's zero gradients), the sentence-transformers export (loaded by
sentence-transformers itself) and the embedding evaluation (retrieval and STS metrics by hand)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from conftest import (
  SENTENCES,
  TEST_UMASK,
  WORDNET_EXCERPT,
  WORDNET_SMALL,
  modes_not_from_the_umask,
  run_in_process,
  tiny_config,
)
from minilm_jax.devices import parallel
from minilm_jax.distill import untrained
from minilm_jax.distill.trainer import build_distillation
from minilm_jax.errors import UserError
from minilm_jax.evaluation import sentences as sentence_eval
from minilm_jax.models import embeddings
from minilm_jax.models.encoder import Encoder, EncoderConfig, init_params
from minilm_jax.transfer.objectives import Objective, Outputs

_LAST_LAYER_BUT_QKV = [
  "layer_1/attention/LayerNorm/bias",
  "layer_1/attention/LayerNorm/scale",
  "layer_1/attention/output/bias",
  "layer_1/attention/output/kernel",
  "layer_1/intermediate/bias",
  "layer_1/intermediate/kernel",
  "layer_1/output/bias",
  "layer_1/output/kernel",
  "layer_1/output_LayerNorm/bias",
  "layer_1/output_LayerNorm/scale",
]
_POOLER = ["pooler/bias", "pooler/kernel"]


@pytest.mark.parametrize(
  "name,weight,expected",
  [
    ("minilm", 0.0, _LAST_LAYER_BUT_QKV + _POOLER),  # the symptom: the last layer's block stays random
    ("minilm", 1.0, _POOLER),  # the embedding term reads the last layer's output
    ("hidden_mse", 0.0, _POOLER),
    ("embedding", 1.0, _POOLER),
  ],
)
def test_untrained_parameters_are_those_with_zero_gradient(name, weight, expected):
  """The traced liveness pass names exactly the leaves whose autodiff gradient is zero on real inputs."""
  teacher_config = EncoderConfig(
    vocab_size=100, num_layers=3, hidden_size=32, num_heads=4, intermediate_size=64, max_position_embeddings=16
  )
  student_config = teacher_config.replace(num_layers=2, hidden_size=16, intermediate_size=32)
  teacher, student = Encoder(teacher_config), Encoder(student_config)
  teacher_params = init_params(teacher_config, jax.random.key(0))
  objective = Objective(
    name, ((1, 2),), ("qk", "vv"), 4, 0, 32, 16, 3, 2, weight, "mse", embeddings.Pooling(normalize=True)
  )
  params = {
    **init_params(student_config, jax.random.key(1)),
    **objective.init_learned(jax.random.key(2), student_config),
  }
  traces, find = [], untrained.untrained_student_parameters
  with pytest.MonkeyPatch.context() as patch:
    traced = untrained.untrained_parameters
    patch.setattr(untrained, "untrained_parameters", lambda *a: traces.append(a) or traced(*a))
    assert sorted(find(teacher, student, objective, teacher_params, params)) == expected
    first = len(traces)
    # Asked again with the same models, objective and shapes (other values): answered, not traced again.
    again = find(teacher, student, objective, *jax.tree.map(jnp.zeros_like, (teacher_params, params)))
  assert sorted(again) == expected and len(traces) == first <= 1

  ids = jax.random.randint(jax.random.key(3), (2, 8), 1, 100)
  mask = jnp.ones_like(ids).at[1, 6:].set(0)

  def loss(p):
    t = teacher.apply({"params": teacher_params}, ids, mask, jnp.zeros_like(ids))
    s = student.apply({"params": p}, ids, mask, jnp.zeros_like(ids))
    outputs = [Outputs(out.layers, last_hidden_state=out.last_hidden_state) for out in (t, s)]
    return sum(objective(*outputs, {"attention_mask": mask}, p.get("projection", {})).values())

  grads = traverse_util.flatten_dict(jax.jit(jax.grad(loss))(params), sep="/")  # one program, not op by op
  assert sorted(k for k, g in grads.items() if not np.any(np.asarray(g))) == expected


def test_sentence_embeddings_pool_mean_or_cls_and_normalise():
  hidden = jnp.asarray([[[1.0, 0.0], [3.0, 4.0], [100.0, 100.0]]])
  mask = jnp.asarray([[1, 1, 0]])
  np.testing.assert_allclose(embeddings.sentence_embeddings(hidden, mask, embeddings.Pooling("mean")), [[2.0, 2.0]])
  np.testing.assert_allclose(
    embeddings.sentence_embeddings(hidden, mask, embeddings.Pooling("cls", True)), [[1.0, 0.0]]
  )
  kernel = jnp.asarray([[0.0], [2.0]])
  np.testing.assert_allclose(embeddings.sentence_embeddings(hidden, mask, embeddings.Pooling("mean"), kernel), [[4.0]])
  a, b = jnp.asarray([[0.6, 0.8]]), jnp.asarray([[1.0, 0.0]])
  assert float(embeddings.EMBEDDING_LOSSES["mse"](a, b)) == pytest.approx(0.4**2 + 0.8**2)
  assert float(embeddings.EMBEDDING_LOSSES["cosine"](a, b)) == pytest.approx(0.4)


def test_pipelines_read_from_model_directories(minilm_dir, tiny_teacher, tmp_path):
  assert embeddings.read_pipeline(minilm_dir, 128) == (embeddings.Pooling("mean", True, 256), None)
  assert embeddings.read_pipeline(tiny_teacher, 128) == (embeddings.Pooling("mean", False, 128), None)
  (tmp_path / "1_Pooling").mkdir()
  (tmp_path / "modules.json").write_text(
    json.dumps(
      [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      ]
    )
  )
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
  with pytest.raises(UserError, match="pools by \\['max_tokens'\\]: we reproduce mean or cls pooling alone"):
    embeddings.read_pipeline(str(tmp_path), 128)


def test_retrieval_and_sts_scores_by_hand():
  # Two queries, four documents on the unit circle; query 0's relevant documents are 0 and 2.
  docs = np.array([[1.0, 0.0], [0.0, 1.0], [0.8, 0.6], [-1.0, 0.0]])
  queries = np.array([[0.6, 0.8], [0.0, -2.0]])
  # Cosines of query 0: 0.6, 0.8, 0.96, -0.6 (ranking 2, 1, 0, 3); of query 1: 0, -1, -0.6, 0 (ranking 0, 3, 2, 1).
  scores = sentence_eval.retrieval_scores(queries, docs, [[0, 2], [1]])
  # recall@1: query 0 has doc 2 first (1 of 2 relevant) -> 0.5; query 1's doc 1 (cos -1) is last -> 0.
  assert scores["recall@1"] == pytest.approx((0.5 + 0.0) / 2)
  assert scores["recall@10"] == pytest.approx((1.0 + 1.0) / 2)
  assert scores["mrr@10"] == pytest.approx((1.0 + 1 / 4) / 2)
  # Unrelated-pair cosine: the mean over ordered pairs of different rows.
  assert sentence_eval.unrelated_cosine(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])) == pytest.approx(
    (0.0 + 2**-0.5 + 2**-0.5) * 2 / 6
  )
  # STS: cosines 1, 0, -1 against gold 5, 3, 4 -> ranks (3, 2, 1) vs (3, 1, 2): Spearman 1 - 6 * 2 / (3 * 8) = 0.5.
  a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
  b = np.array([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
  assert sentence_eval.sts_spearman(a, b, [5.0, 3.0, 4.0]) == pytest.approx(0.5)


def test_wordnet_retrieval_pairs_definitions_with_their_own_examples():
  retrieval = sentence_eval.wordnet_retrieval(WORDNET_EXCERPT)
  assert len(retrieval.queries) == len(retrieval.relevant) > 500
  assert sorted(i for gold in retrieval.relevant for i in gold) == list(range(len(retrieval.documents)))
  assert (
    retrieval.queries[1] == "a human being"
    and retrieval.documents[retrieval.relevant[1][0]] == "there was too much for one person to do"
  )


@pytest.mark.slow
def test_embedding_student_exports_to_sentence_transformers_and_is_evaluated(minilm_dir, tiny_corpus, tmp_path, capfd):
  """The real all-MiniLM-L6-v2 (mean pooling, normalised) teaches a 2x16 student the embeddings plus
  the relations; the export (with its 16 -> 384 Dense map) loads in sentence-transformers and
  reproduces our embeddings; the evaluation program scores the run and the teacher."""
  from sentence_transformers import SentenceTransformer

  workdir = str(tmp_path / "run")
  config = tiny_config(minilm_dir, tiny_corpus, **{"loss.embedding_weight": 1.0, "num_steps": 4})
  config.loss.num_relation_heads = 4
  run = build_distillation(config, workdir, parallel.make_mesh(2))
  assert list(run.lone.untrained) == _POOLER and run.lone.step.objective.projection_shapes() == {"embedding": (16, 384)}
  run.run()
  metrics = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert all(np.isfinite(m["loss_embedding_mse"]) for m in metrics)

  out = str(tmp_path / "st")
  proc = run_in_process(
    "convert", "--to-hf", "--sentence-transformers", "--workdir", workdir, "--out", out, capfd=capfd, umask=TEST_UMASK
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "2 parameters never received a gradient" in proc.stderr and "pooler/kernel" in proc.stderr
  assert not modes_not_from_the_umask(out)  # 2_Dense/model.safetensors among them (safetensors' writer made it 0600)
  assert json.load(open(os.path.join(out, "modules.json")))[2:] == [
    {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    {"idx": 3, "name": "3", "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"},
  ]

  ours = sentence_eval.SentenceEncoder.load(workdir, parallel.make_mesh(2), 8, 64)(SENTENCES)
  theirs = SentenceTransformer(out, device="cpu").encode(SENTENCES)
  assert ours.shape == (len(SENTENCES), 384)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  np.testing.assert_allclose(
    sentence_eval.SentenceEncoder.load(out, parallel.make_mesh(2), 8, 64)(SENTENCES), theirs, atol=1e-5
  )

  sts = tmp_path / "sts.tsv"
  sts.write_text(
    "sentence1\tsentence2\tscore\n"
    + "".join(f"{a}\t{b}\t{i % 5}.0\n" for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])))
  )
  results = tmp_path / "eval"
  proc = run_in_process(
    "evaluate",
    "--embeddings",
    f"{workdir},{minilm_dir}",
    "--out",
    str(results),
    "--wordnet_dir",
    WORDNET_SMALL,
    "--sts",
    str(sts),
    "--max_seq_length",
    "32",
    "--eval_batch_size",
    "128",
    capfd=capfd,
    umask=TEST_UMASK,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not modes_not_from_the_umask(str(results))
  report = json.load(open(results / "embeddings.json"))
  assert [r["model"] for r in report["rows"]] == [workdir, minilm_dir] and report["max_seq_length"] == 32
  student, teacher = report["rows"]
  assert {"recall@1", "recall@10", "mrr@10", "unrelated_cosine", "sts_spearman"} <= set(student)
  assert teacher["recall@10"] > 0.3 > student["recall@10"]  # a 4-step student is far from its teacher


def test_embedding_settings_that_cannot_work_are_one_line_errors():
  from minilm_jax.distill.config import base_config
  from minilm_jax.transfer.objectives import make_objective

  teacher = EncoderConfig(num_layers=6, hidden_size=384, intermediate_size=1536)
  student = teacher.replace(num_layers=3)
  c = base_config()
  c.loss.embedding_weight, c.loss.embedding_loss = 1.0, "l1"
  with pytest.raises(UserError, match="unknown loss.embedding_loss 'l1': use one of mse, cosine"):
    make_objective(c.loss, teacher, student, 5, 2)
  c.loss.embedding_loss, c.loss.objective = "cosine", "mlm_kd"
  with pytest.raises(UserError, match="loss.embedding_weight > 0 with loss.objective=mlm_kd"):
    make_objective(c.loss, teacher, student, 5, 2)
  c.loss.objective = "embedding"  # the term alone, weight 1, reading both models' last layers
  objective = make_objective(c.loss, teacher, student, 5, 2)
  assert (objective.embedding_weight, objective.teacher_layers_needed, objective.student_layers_needed) == (1.0, 6, 3)
