"""Property tests (issue 14): random config overrides and malformed corpus files thrown at the `train`
program. Each either runs or exits 2 with one line on stderr; never a traceback, never silence.
`python -m pytest -q tests/test_fuzz.py --hypothesis-show-statistics` counts how each ended.

The program runs in this process (through the same `program.run_program` that `python -m
minilm_jax.train` starts with), so each example costs a flag parse and, when the overrides are
valid, a one-step run, not a Python and JAX start-up."""

import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from conftest import DAMAGE, ROOT, damaged_bytes, output_lines, run_in_process

# Every field of a distillation config (configs/embedding_demo.py) a user might mistype, with values
# a user might mistype it to: wrong types, zero, negative, out of the choices, and a few that are
# valid. Sizes stay small, so that a valid example runs in seconds (a huge model is the machine's
# limit, not bad input).
_NAMES = st.sampled_from(
  [
    "",
    "x",
    "none",
    "1e-3",
    "-1",
    "random",
    "etd",
    "minilm",
    "minilmv2",
    "qk,vv",
    "qq,zz",
    "bfloat16",
    "float16",
    "int8",
    "last",
    "all",
    "uniform",
    "top",
    "impt",
    "/nonexistent",
  ]
)
_SMALL_INTS = st.sampled_from([-7, -1, 0, 1, 2, 3, 5, 8, 12, 16])
_FLOATS = st.sampled_from(["-1.0", "0.0", "nan", "inf", "1e-3", "0.5", "1e9"])
_FIELDS = {
  "seed": _SMALL_INTS,
  "teacher.layer": _SMALL_INTS,
  "student.model_type": _NAMES,
  "student.vocab_size": _SMALL_INTS,
  "student.num_layers": _SMALL_INTS,
  "student.hidden_size": _SMALL_INTS,
  "student.num_heads": _SMALL_INTS,
  "student.intermediate_size": _SMALL_INTS,
  "student.dropout": _FLOATS,
  "student.layer": _SMALL_INTS,
  "student.init": _NAMES,
  "etd.method": _NAMES,
  "etd.layers": _NAMES,
  "etd.num_sentences": _SMALL_INTS,
  "loss.objective": _NAMES,
  "loss.layer_map": _NAMES,
  "loss.relations": _NAMES,
  "loss.num_relation_heads": _SMALL_INTS,
  "loss.query_chunk": _SMALL_INTS,
  "data.text_column": _NAMES,
  "data.max_seq_length": _SMALL_INTS,
  "data.num_proc": _SMALL_INTS,
  "optimizer.lr": _FLOATS,
  "optimizer.warmup_steps": _SMALL_INTS,
  "optimizer.clip_norm": _FLOATS,
  "optimizer.accumulate_steps": _SMALL_INTS,
  "batch_size": _SMALL_INTS,
  "num_steps": st.sampled_from([-1, 0, 1, 2]),
  "dtype": _NAMES,
  "checkpoint.every": _SMALL_INTS,
  "checkpoint.keep": _SMALL_INTS,
  "log_every": _SMALL_INTS,
  "student.hidden_sise": _SMALL_INTS,  # misspelt on purpose
}
_OVERRIDES = st.lists(st.sampled_from(sorted(_FIELDS)), min_size=1, max_size=3, unique=True).flatmap(
  lambda names: st.tuples(*(st.tuples(st.just(n), _FIELDS[n]) for n in names))
)

# Corpus files as users get them wrong: empty, binary, another encoding, JSON lines without the
# text column or not objects at all, a single enormous line.
_JSONL_LINES = st.one_of(
  st.just('{"text": "a short line of prose."}'),
  st.just('{"body": "no text column"}'),
  st.just("[1, 2, 3]"),
  st.just('{"text": 5}'),
  st.just('{"text": '),
  st.just(""),
  st.text(max_size=30),
)
_CORPORA = st.one_of(
  st.tuples(st.just(".txt"), st.binary(max_size=200)),
  st.tuples(st.just(".txt"), st.text(max_size=200).map(lambda t: t.encode("utf-16"))),
  st.tuples(st.just(".txt"), st.just(("word " * 200_000).encode())),
  st.tuples(st.just(".jsonl"), st.lists(_JSONL_LINES, max_size=6).map(lambda ls: "\n".join(ls).encode())),
  st.tuples(st.just(".json"), st.sampled_from([b"", b"{", b"[]", b'{"text": ["a", 1]}', b"null"])),
  st.tuples(st.just(".parquet"), st.binary(max_size=100)),
)


def _run_train(args, capfd):
  """`python -m minilm_jax.train <args>` in this process: (exit status, stderr)."""
  proc = run_in_process("train", *args, capfd=capfd)
  return proc.returncode, proc.stderr


def _tiny_args(teacher, corpus, workdir):
  """A one-step run of a 2x16 student that every example starts from."""
  return [
    "--config",
    # The demo's sibling without evaluators: every example runs in seconds (tests/test_evaluators.py
    # tries the evaluators' fields).
    os.path.join(ROOT, "configs", "embedding_demo.py"),
    "--workdir",
    workdir,
    f"--config.teacher.path={teacher}",
    f"--config.data.corpus={corpus}",
    "--config.data.max_seq_length=16",
    "--config.student.num_layers=2",
    "--config.student.hidden_size=16",
    "--config.student.num_heads=4",
    "--config.student.intermediate_size=32",
    "--config.loss.num_relation_heads=4",
    "--config.batch_size=8",
    "--config.num_steps=1",
    "--config.optimizer.warmup_steps=1",
  ]


def _assert_ran_or_one_line(status, err, what):
  lines = output_lines(err)
  event("ran" if status == 0 else "one-line error (exit 2)" if status == 2 and len(lines) == 1 else "FAILED")
  if status == 0:
    assert "Traceback" not in err, f"{what}: a traceback in a run that went on:\n{err[-3000:]}"
    return
  assert status == 2, f"{what}: exit {status}, not 0 or 2:\n{err[-3000:]}"
  assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: not one line:\n{err[-3000:]}"


# A fixed sequence of examples (the same on every machine), reported as drawn: shrinking would rerun
# the program for minutes.
_SETTINGS = settings(
  max_examples=30,
  deadline=None,
  derandomize=True,
  database=None,
  phases=[Phase.generate],
  suppress_health_check=list(HealthCheck),
)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
@_SETTINGS
@given(overrides=_OVERRIDES)
def test_random_config_overrides_run_or_are_one_line(tiny_teacher, tiny_corpus, capfd, overrides):
  with tempfile.TemporaryDirectory() as tmp:
    args = _tiny_args(tiny_teacher, tiny_corpus, os.path.join(tmp, "w")) + [f"--config.{k}={v}" for k, v in overrides]
    _assert_ran_or_one_line(*_run_train(args, capfd), f"overrides {overrides}")


@pytest.mark.filterwarnings("ignore")
@_SETTINGS
@given(corpus=_CORPORA)
def test_malformed_corpus_files_run_or_are_one_line(tiny_teacher, capfd, corpus):
  suffix, content = corpus
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "corpus" + suffix)
    with open(path, "wb") as f:
      f.write(content)
    _assert_ran_or_one_line(
      *_run_train(_tiny_args(tiny_teacher, path, os.path.join(tmp, "w")), capfd), f"corpus {suffix} {content[:80]!r}"
    )


def _reader_files(tmp):
  """{reader: (task, file name, valid content)}: one small valid file per format we read."""
  from conftest import WORDNET_EXCERPT

  with open(os.path.join(WORDNET_EXCERPT, "data.noun"), "rb") as f:
    wordnet = b"".join(f.readlines()[:60])
  squad = json.dumps(
    {
      "data": [
        {
          "paragraphs": [
            {
              "context": "Café au lait is coffee with milk.",
              "qas": [
                {"id": "q1", "question": "What is it?", "answers": [{"text": "coffee", "answer_start": 16}]},
                {"id": "q2", "question": "Why?", "answers": [], "is_impossible": True},
              ],
            }
          ]
        }
      ]
    },
    ensure_ascii=False,
  ).encode()
  squad_v1 = json.dumps(  # MLQA's files are SQuAD 1.1's format: every question answered
    {
      "data": [
        {
          "paragraphs": [
            {
              "context": "Café au lait is coffee with milk.",
              "qas": [{"id": "q1", "question": "What is it?", "answers": [{"text": "coffee", "answer_start": 16}]}],
            }
          ]
        }
      ]
    },
    ensure_ascii=False,
  ).encode()
  import io

  import pyarrow as pa
  import pyarrow.parquet as pq

  rows = [("Café au lait, s'il vous plaît.", "yes"), ("A plain sentence.", "no"), ("Another one.", "no")]
  parquet = io.BytesIO()
  pq.write_table(pa.table({"text": [t for t, _ in rows], "label": [y for _, y in rows]}), parquet)
  return {
    "custom_csv": ("dev.csv", ("text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows)).encode()),
    "custom_tsv": ("dev.tsv", ("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in rows)).encode()),
    "custom_jsonl": ("dev.jsonl", "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows).encode()),
    "custom_parquet": ("dev.parquet", parquet.getvalue()),
    "wordnet_supersense": ("data.noun", wordnet),
    "squad2": ("dev-v2.0.json", squad),
    "qg": ("dev.json", squad),
    "sst2": ("dev.tsv", "sentence\tlabel\nCafé au lait, s'il vous plaît.\t1\nA plain sentence.\t0\n".encode()),
    "xnli": (
      "dev.tsv",
      "language\tgold_label\tsentence1\tsentence2\nfr\tentailment\tCafé au lait.\tUn café.\n"
      "en\tneutral\tA plain sentence.\tAnother one.\n".encode(),
    ),
    "mlqa": ("dev-context-en-question-en.json", squad_v1),
    "cnndm": (
      "dev.jsonl",
      '{"article": "Café news.", "highlights": "A café."}\n{"source": "b", "target": "c"}\n'.encode(),
    ),
  }


@pytest.mark.parametrize(
  "task_name",
  [
    "wordnet_supersense",
    "squad2",
    "qg",
    "sst2",
    "xnli",
    "mlqa",
    "cnndm",
    "custom_csv",
    "custom_tsv",
    "custom_jsonl",
    "custom_parquet",
  ],
)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), phases=[Phase.generate])
@given(how=st.sampled_from(DAMAGE), data=st.data())
def test_damaged_task_files_load_or_are_one_line_naming_the_file(task_name, how, data):
  """Every format a task reads, damaged: it loads (damage that leaves a valid file) or raises
  UserError, one line naming the file; never another exception."""
  import ml_collections

  from minilm_jax.errors import UserError
  from minilm_jax.tasks import get_task
  from minilm_jax.tasks.custom import custom_task

  with tempfile.TemporaryDirectory() as tmp:
    name, valid = _reader_files(tmp)[task_name]
    path = os.path.join(tmp, name)
    with open(path, "wb") as f:
      f.write(damaged_bytes(valid, how, data))
    try:
      if task_name.startswith("custom_"):  # the user's own file, as task=custom's training and dev file
        fields = dict(train=path, dev=path, text_columns="text", label_column="label", labels="", regression=False)
        custom_task(ml_collections.ConfigDict({**fields, "metrics": ""})).load("dev")
      else:
        get_task(task_name).load("dev", tmp)
      event(f"{how}: loaded")
    except UserError as e:
      assert "\n" not in str(e) and name in str(e), str(e)
      event(f"{how}: one line")
