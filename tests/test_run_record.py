"""A run's record: every kind saved and read back typed, and the runs the last release wrote (tests/data/
release_runs, one tiny run of each kind, made by minilm_jax at a8c938b before records were typed) read
by today's readers: their record, their parameters, their export."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from conftest import ROOT
from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import EncoderConfig
from minilm_jax.runs import record as records
from minilm_jax.runs.reading import read_multitask_run
from minilm_jax.runs.record import RunRecord

RELEASE_RUNS = os.path.join(ROOT, "tests", "data", "release_runs")


def _release_run(tmp_path, kind: str) -> str:
  """A copy (readers may set damaged steps aside; the fixture stays as it was committed)."""
  return shutil.copytree(os.path.join(RELEASE_RUNS, kind), str(tmp_path / kind))


def test_every_kind_round_trips_through_json():
  encoder = EncoderConfig(vocab_size=99, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32)
  made = [
    RunRecord(
      records.DISTILLATION,
      encoder,
      {"teacher": {"path": "/t"}, "loss": {"objective": "minilm"}},
      untrained=("pooler/dense/kernel",),
      heldout={"blocks": 2, "first_block": 10},
      sentence_embedding={"mode": "mean", "dense": None},
    ),
    RunRecord(records.FINETUNING, encoder, {"task": "sst2"}, head={"kind": "classification", "num_labels": 2}),
    RunRecord(records.REFINED_TEACHER, encoder, {}, heads=(("a", 2), ("b", 3)), tasks=("a", "b")),
    RunRecord(
      records.TASK_STUDENT,
      None,
      {"teacher": "/r"},
      heads=(("a", 2),),
      tasks=("a",),
      task_student_settings={"kind": "bilstm"},
    ),
    RunRecord(records.CONVERTED, encoder, source="/hf"),
  ]
  for record in made:
    saved = json.loads(json.dumps(record.to_json()))  # as Orbax's JsonSave writes it
    assert saved["version"] == records.VERSION
    assert RunRecord.from_json(saved) == record
  assert made[0].teacher == "/t" and made[0].objective == "minilm" and made[3].teacher == "/r"
  assert made[2].multi_task and made[3].multi_task and not made[1].multi_task


@pytest.mark.parametrize(
  "saved, message",
  [
    ({"version": 2, "kind": "distillation"}, "version 2, newer than this minilm_jax reads"),
    ({"version": 1, "kind": "pruned", "encoder": None}, "unknown run kind 'pruned'"),
    ({"version": 1, "kind": "converted", "encoder": None, "colour": 1}, "unknown fields \\['colour'\\]"),
  ],
)
def test_records_this_release_cannot_read_are_one_line_errors(saved, message):
  with pytest.raises(UserError, match=message):
    RunRecord.from_json(saved)


def test_the_last_releases_runs_have_their_kinds_and_contents():
  kinds = {kind: runs.read_record(os.path.join(RELEASE_RUNS, kind)) for kind in records.KINDS}
  assert all(record.kind == kind for kind, record in kinds.items())
  distilled = kinds["distillation"]
  assert distilled.encoder.num_layers == 2 and distilled.objective == "minilm" and distilled.teacher
  assert distilled.sentence_embedding["mode"] == "mean"
  assert kinds["finetuning"].tasks == ("wordnet_supersense",) and kinds["finetuning"].head["kind"] == "classification"
  assert kinds["refined_teacher"].heads == (("wordnet_supersense", 5), ("wordnet_examples", 2))
  student = kinds["task_student"]
  assert student.encoder is None and student.task_student_settings["kind"] == "biattentive" and student.vocab_size > 0
  assert student.tasks == ("wordnet_supersense", "wordnet_examples")
  assert kinds["converted"].source and kinds["converted"].config == {}


def test_the_last_releases_runs_load_and_export(tmp_path):
  """Their parameters restore into today's models, and an encoder run exports to Hugging Face."""
  import transformers

  mesh = parallel.make_mesh(2, 1)
  for kind in ("distillation", "finetuning", "converted", "refined_teacher"):
    loaded = runs.load_encoder(_release_run(tmp_path, kind))
    assert (
      loaded.config.hidden_size == 16 and np.isfinite(loaded.params["embeddings"]["word_embeddings"]["embedding"]).all()
    )
  for kind in ("refined_teacher", "task_student"):
    model, params, tokenizer, tasks, joint = read_multitask_run(os.path.join(RELEASE_RUNS, kind), mesh)
    assert [t.name for t in tasks] == ["wordnet_supersense", "wordnet_examples"] and tokenizer is not None
    assert {f"head_{t.name}" for t in tasks} <= set(params)
  with pytest.raises(UserError, match="biattentive student, which has no Transformer encoder"):
    runs.read_run(os.path.join(RELEASE_RUNS, "task_student"))
  out = str(tmp_path / "hf")
  runs.export_run(os.path.join(RELEASE_RUNS, "finetuning"), out)
  model = transformers.AutoModelForSequenceClassification.from_pretrained(out)
  assert model.config.num_labels == 5
  kernel = runs.read_run(os.path.join(RELEASE_RUNS, "finetuning")).params["classifier"]["kernel"]
  np.testing.assert_allclose(model.classifier.weight.detach().numpy().T, jax.device_get(kernel), rtol=1e-6)
