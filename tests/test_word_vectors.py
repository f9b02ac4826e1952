"""The thesis's word vectors (section 3.4.1) for the LSTM students: the three file formats read to the
same vectors, the word-level tokenizer, and a distillation run whose frozen channel stays as loaded
(a small vectors file written here, the real WordNet task)."""

import os
import re
import struct

import numpy as np
import pytest

from conftest import WORDNET_SMALL, run_distill_task, run_in_process
from minilm_jax import runs
from minilm_jax.data import word_vectors
from minilm_jax.errors import UserError
from minilm_jax.evaluation.finetuned_runs import evaluate_runs
from minilm_jax.models import hf
from minilm_jax.task_distill.config import task_distillation_config
from minilm_jax.task_distill.run import build_task_distillation

DIM = 8
WORDS = ["the", "of", "a", "plant", "family", "Araceae", "genus", "tropical", "flowers", "Fedora", "zygote"]


def _vectors(words=WORDS):
  rng = np.random.default_rng(0)
  return {w: rng.normal(size=DIM).astype(np.float32) for w in words}


def write_binary(path, vectors):
  """word2vec's C tool's format: header line, then word, space, float32s, newline."""
  with open(path, "wb") as f:
    f.write(f"{len(vectors)} {DIM}\n".encode())
    for word, vector in vectors.items():
      f.write(word.encode() + b" " + struct.pack(f"<{DIM}f", *vector) + b"\n")


def write_text(path, vectors, header=True):
  """word2vec text (header) or GloVe (no header); repr of float32 round-trips exactly."""
  with open(path, "w") as f:
    if header:
      f.write(f"{len(vectors)} {DIM}\n")
    for word, vector in vectors.items():
      f.write(word + " " + " ".join(repr(float(v)) for v in vector) + "\n")


@pytest.fixture
def vector_files(tmp_path):
  vectors = _vectors()
  files = {"bin": tmp_path / "w2v.bin", "text": tmp_path / "w2v.txt", "glove": tmp_path / "glove.txt"}
  write_binary(files["bin"], vectors)
  write_text(files["text"], vectors)
  write_text(files["glove"], vectors, header=False)
  return vectors, {k: str(v) for k, v in files.items()}


def test_every_format_reads_the_vectors_written(vector_files):
  vectors, files = vector_files
  for path in files.values():
    read, cased = word_vectors.read_word_vectors(path, 0)
    assert cased  # "Araceae", "Fedora"
    assert list(read) == WORDS
    for word in WORDS:
      np.testing.assert_array_equal(read[word], vectors[word])
  # The first `max_words`, then words asked for that come later in the file.
  assert list(word_vectors.read_word_vectors(files["bin"], 3, {"zygote", "absent"})[0]) == WORDS[:3] + ["zygote"]


def test_vocabulary_and_tokenizer(vector_files, tmp_path):
  vectors, files = vector_files
  tokenizer, kept, dim = word_vectors.vocabulary(files["text"], 4, ["A plant, of Araceae!", "unseen words"])
  assert dim == DIM
  # The file's first 4 words, its vectors of training words, then training words it lacks.
  assert set(kept) == {"the", "of", "a", "plant", "Araceae"}
  vocab = tokenizer.get_vocab()
  assert [vocab[t] for t in ("[PAD]", "[UNK]", "[MASK]")] == [0, 1, 2]
  assert {"A", ",", "!", "unseen", "words"} <= vocab.keys() and "genus" not in vocab  # cased file: cased words
  enc = tokenizer("a plant [MASK] genus", add_special_tokens=False)["input_ids"]
  assert enc == [vocab["a"], vocab["plant"], vocab["[MASK]"], vocab["[UNK]"]]
  table = word_vectors.embedding_matrix(tokenizer, kept, dim, seed=0)
  np.testing.assert_array_equal(table[vocab["Araceae"]], vectors["Araceae"])
  assert not table[0].any() and np.abs(table[vocab["unseen"]]).max() <= 0.25
  # Saved and reloaded as any run's tokenizer, it splits alike.
  tokenizer.save_pretrained(tmp_path / "tok")
  again = hf.load_tokenizer(str(tmp_path / "tok"))
  assert again("a plant [MASK] genus", add_special_tokens=False)["input_ids"] == enc
  # A lower-cased file (GloVe 6B) lower-cases the text.
  write_text(tmp_path / "lower.txt", _vectors([w.lower() for w in WORDS]), header=False)
  lower, _, _ = word_vectors.vocabulary(str(tmp_path / "lower.txt"), 0, ["Araceae Plant"])
  assert lower("ARACEAE", add_special_tokens=False)["input_ids"] == [lower.get_vocab()["araceae"]]


@pytest.mark.parametrize(
  "name, content, message",
  [
    ("empty.txt", b"", "line 1: the file is empty"),
    ("short.txt", b"2 3\nthe 0.1 0.2 0.3\nof 0.1 0.2\n", "line 3: 2 values where the file's vectors have 3"),
    ("nan.txt", b"the 0.1 nan 0.3\n", "not finite"),
    ("word.txt", b"the 0.1 x 0.3\n", "line 1 ('the'): a value that is not a number"),
    ("latin1.txt", b"caf\xe9 0.1 0.2\n", "line 1: a word that is not UTF-8"),
    ("noheader.bin", b"the \x00\x00\x00\x00", "line 1: expected the header 'count dim'"),
    ("cut.bin", b"2 1\nthe \x00\x00\x80\x3f\nof \x00\x00", "record 2: the file ends inside a vector"),
    ("few.bin", b"3 1\nthe \x00\x00\x80\x3f", "record 2: the file ends before the header's count"),
    ("more.bin", b"1 1\nthe \x00\x00\x80\x3f\nof \x00\x00\x80\x3f", "record 2: the file goes on after the 1 vectors"),
    (
      "more.txt",
      b"3 2\n" + b"".join(b"w%d 0.1 0.2\n" % i for i in range(40)),
      "line 1: the header counts 3 vectors and the file holds 40",
    ),
    (
      "fewer.txt",
      b"500 2\n" + b"".join(b"w%d 0.1 0.2\n" % i for i in range(40)),
      "line 1: the header counts 500 vectors and the file holds 40",
    ),
    ("late.txt", b"the 0.1 0.2\n" * 5 + b"of 0.1 x\n", "line 6 ('of'): a value that is not a number"),
    # A line without its word: its first value read as the word (a space before a word is no word).
    ("space.txt", b"the 0.1 0.2\n 0.1 0.2\n", "line 2: 1 values where the file's vectors have 2"),
    ("bombin.txt", b"\xef\xbb\xbf2 1\nthe 0.1\nof 0.2 0.3\n", "line 3: 2 values where the file's vectors have 1"),
  ],
)
def test_damaged_vectors_files_are_one_line(tmp_path, name, content, message):
  path = tmp_path / name
  path.write_bytes(content)
  with pytest.raises(UserError, match=re.escape(message)) as e:
    word_vectors.read_word_vectors(str(path), 0)
  assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_byte_order_mark_is_read_as_utf8_writes_it(tmp_path, vector_files):
  """A BOM before GloVe's first word or word2vec's header is UTF-8's own mark, not part of the word
  (the first word keeps its vector) nor a reason to refuse the header."""
  vectors, files = vector_files
  for name in ("text", "glove", "bin"):
    path = tmp_path / f"bom_{os.path.basename(files[name])}"
    path.write_bytes(b"\xef\xbb\xbf" + open(files[name], "rb").read())
    read, _ = word_vectors.read_word_vectors(str(path), 0)
    assert list(read) == WORDS, name
    np.testing.assert_array_equal(read["the"], vectors["the"])


def _student_config(vectors_path, **student):
  c = task_distillation_config()
  c.tasks, c.teacher, c.objective = "wordnet_supersense", "", "hard"  # gold labels: no teacher needed
  c.data_dir, c.max_seq_length, c.epochs, c.batch_size, c.log_every = WORDNET_SMALL, 32, 1, 40, 20
  c.student.word_vectors, c.student.embed_dim, c.student.hidden, c.student.fc = vectors_path, DIM, 8, 16
  for k, v in student.items():
    setattr(c.student, k, v)
  c.mesh.data = 2
  return c


@pytest.mark.slow
def test_multichannel_student_keeps_its_static_channel(tmp_path, vector_files):
  vectors, files = vector_files
  c = _student_config(files["bin"])
  run = build_task_distillation(c, str(tmp_path / "run"))
  vocab = run.tokenizer.get_vocab()
  start = run.initial_state()[0].params["body"]
  for channel in ("embedding", "static_embedding"):
    np.testing.assert_array_equal(np.asarray(start[channel]["embedding"])[vocab["plant"]], vectors["plant"])
  state, results = run.run()
  body = state.params["body"]
  assert 0 <= results["wordnet_supersense/dev/accuracy"] <= 1
  np.testing.assert_array_equal(body["static_embedding"]["embedding"], start["static_embedding"]["embedding"])
  assert not np.array_equal(body["embedding"]["embedding"], start["embedding"]["embedding"])
  # The run's own tokenizer and student come back for evaluation, with the run's dev score.
  assert runs.load_tokenizer_of(str(tmp_path / "run")).get_vocab() == vocab
  (row,) = evaluate_runs([str(tmp_path / "run")], str(tmp_path / "eval"))
  assert row["accuracy"] == pytest.approx(results["wordnet_supersense/dev/accuracy"])
  # The vectors file rewritten after the run (one word's vector): its words are the student's
  # vocabulary and its rows the static channel, so the rerun is refused before it reads a checkpoint.
  assert runs.read_record(str(tmp_path / "run")).inputs.keys() == {"student.word_vectors"}
  write_binary(files["bin"], {**vectors, "plant": -vectors["plant"]})
  with pytest.raises(UserError, match=f"student.word_vectors={files['bin']} holds other content than"):
    build_task_distillation(c, str(tmp_path / "run"))


def test_settings_that_contradict_the_vectors_are_one_line(tmp_path, vector_files, capfd):
  _, files = vector_files
  with pytest.raises(UserError, match=f"student.embed_dim=300 but the vectors .* have {DIM} values"):
    build_task_distillation(_student_config(files["glove"], embed_dim=300), str(tmp_path / "a"))
  with pytest.raises(UserError, match="student.word_vectors is for the LSTM students"):
    build_task_distillation(_student_config(files["glove"], kind="transformer"), str(tmp_path / "b"))
  proc = run_in_process(
    "distill_task",
    "--config",
    "configs/task/distilled_bilstm.py",
    "--workdir",
    tmp_path / "c",
    "--config.tasks=wordnet_supersense",
    "--config.objective=hard",
    f"--config.data_dir={WORDNET_SMALL}",
    f"--config.student.word_vectors={os.path.join(tmp_path, 'missing.bin')}",
    capfd=capfd,
  )
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
    f"error: word vectors file {tmp_path / 'missing.bin'} does not exist: fix student.word_vectors"
  )


def test_vectors_files_as_their_writers_write_them(tmp_path, vector_files, caplog):
  """word2vec.c's and fastText's text files end every line with a space after the last value; GloVe
  files written alike: all read as written. A word listed twice keeps its first vector, with one
  warning line naming the file, how many words repeat and the first of them (as gensim warns)."""
  vectors, _ = vector_files
  for header in (True, False):
    path = tmp_path / f"trailing_{header}.vec"
    lines = [f"{len(vectors)} {DIM} "] if header else []
    lines += [word + " " + " ".join(repr(float(v)) for v in vector) + " " for word, vector in vectors.items()]
    path.write_text("\n".join(lines) + "\n")
    read, _ = word_vectors.read_word_vectors(str(path), 0)
    assert list(read) == WORDS
    np.testing.assert_array_equal(read["plant"], vectors["plant"])
  path = tmp_path / "spaced.txt"  # a space before the word, two between the values
  path.write_text(
    "".join(f" {word}  " + "  ".join(repr(float(v)) for v in vector) + "\n" for word, vector in vectors.items())
  )
  read, _ = word_vectors.read_word_vectors(str(path), 0)
  assert list(read) == WORDS
  np.testing.assert_array_equal(read["plant"], vectors["plant"])
  twice = dict(vectors)
  path = tmp_path / "twice.txt"
  write_text(path, twice, header=False)
  with open(path, "a") as f:
    for word in ("plant", "plant", "of"):
      f.write(word + " " + " ".join(["9.0"] * DIM) + "\n")
  with caplog.at_level("WARNING"):
    read, _ = word_vectors.read_word_vectors(str(path), 0)
  np.testing.assert_array_equal(read["plant"], vectors["plant"])
  (warning,) = [r.getMessage() for r in caplog.records if "more than once" in r.getMessage()]
  assert warning == (
    f"word vectors {path}: 2 word(s) listed more than once, the first vector of each kept (first: 'plant', 3 times)"
  )


def test_a_value_past_float32s_range_is_the_one_line_of_the_program(tmp_path):
  """`distill_task` with a vectors file holding 1e39: one line naming the file, the line and the
  word, and no numpy overflow warning before it (on the command line: in a test's process, pytest
  would take the warning)."""
  path = tmp_path / "big.txt"
  path.write_text("the 0.1 0.2\nof 1e39 0.2\n")
  proc = run_distill_task(
    "configs/task/distilled_bilstm.py",
    tmp_path / "run",
    "--config.tasks=wordnet_supersense",
    "--config.objective=hard",
    f"--config.data_dir={WORDNET_SMALL}",
    f"--config.student.word_vectors={path}",
    "--config.student.embed_dim=2",
  )
  assert proc.returncode == 2 and "overflow" not in proc.stderr, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
    f"error: word vectors {path}, line 2 ('of'): a value that is not finite; is it a word2vec or GloVe text file?"
  )
