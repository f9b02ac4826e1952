"""Teachers of other architectures than BERT's (`models.config.MODEL_TYPES`): each distilled by
MiniLM's relations into a student of its own architecture (started from its layers) and into a
BERT-shaped student on its vocabulary; a student that cannot be either is one line before any work."""

import jax
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


@pytest.mark.parametrize("student", STUDENTS)
@pytest.mark.parametrize("objective", OBJECTIVES)
def test_an_mpnet_teacher_distils_into_mpnet_and_bert_students(
  tiny_mpnet_teacher, tiny_corpus, tmp_path, objective, student
):
  """Two steps of the train program's run from the MPNet teacher: every loss term finite, the
  student's record of the architecture it was asked for, its export loadable."""
  overrides = {"num_steps": 2, "student.model_type": "mpnet", **OBJECTIVES[objective], **STUDENTS[student]}
  config = tiny_config(tiny_mpnet_teacher, tiny_corpus, **overrides)
  state = build_distillation(config, str(tmp_path / "run")).run()
  assert int(state.step) == 2 and all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
  record = runs.read_record(str(tmp_path / "run"))
  assert record.encoder.model_type == config.student.model_type
  if student == "own_family_etd":
    assert "relative_attention_bias" in state.params and "token_type_embeddings" not in state.params["embeddings"]


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
