"""The defaults every fine-tuning config starts from: `configs/finetune/*.py` override what their task changes."""

import ml_collections

from minilm_jax.data import augment
from minilm_jax.training.loop import TRAINING_RANGES, Above
from minilm_jax.training.train_state import OPTIMIZER_RANGES, adamw_config

# The fields of `base_config` (and of the SQuAD and sequence-to-sequence settings) that have a
# range (`loop.check_fields`): (least, bound to stay below).
RANGES = {
  **TRAINING_RANGES,
  **OPTIMIZER_RANGES,
  "seeds": (1, None),
  "dropout": (0, 1),
  "max_seq_length": (2, None),  # [CLS] and [SEP]
  "n_best": (1, None),
  "max_answer_length": (1, None),
  "doc_stride": (1, None),
  "distill.temperature": (Above(0), None),  # the logits are divided by it
  "distill.layers_weight": (0, None),
  **augment.RANGES,
}


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli, xnli, squad1, squad2, mlqa, wordnet_supersense,
  # wordnet_examples; sequence-to-sequence: qg, cnndm, xsum, wordnet_definitions; or custom (data.*)
  c.task = "sst2"
  c.init = ""  # a run's workdir (distillation, fine-tuning, convert --from-hf) or a Hugging Face directory
  # The task's folder of GLUE TSV / SQuAD JSON files (several tasks: one folder for all, or a comma
  # list of one per task); empty: the Hugging Face hub (online).
  c.data_dir = ""
  c.language = ""  # XNLI from the hub: the language subset
  c.max_seq_length = 128
  c.batch_size = 32
  c.eval_batch_size = 128
  c.epochs = 3
  c.dropout = 0.1
  c.dtype = "float32"  # bfloat16 on accelerators
  c.seed = 0
  c.seeds = 1  # > 1: every setting runs with seeds seed, seed + 1, ...; tables give mean and std

  c.optimizer = adamw_config(lr=3e-5, clip_norm=1.0)
  c.optimizer.warmup_proportion = 0.1  # of all steps, then linear decay to 0

  c.data = _custom_data_config()  # task=custom's files and columns

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # devices on the batch axis; -1: all that the model axis leaves
  c.mesh.model = 1  # devices each parameter matrix is split over

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 1000
  c.checkpoint.keep = 1
  c.checkpoint.best = ""  # "<evaluator>/<metric>", e.g. "task/dev/accuracy": that step kept beside the newest

  # What the run measures while it trains (evaluation/evaluators.py), each every `every` steps and
  # at step 0: its task's dev metrics (`kind="task"`), a probe, retrieval or STS score of its
  # encoder's sentence embeddings, e.g. c.evaluators.task = dict(kind="task", every=200).
  c.evaluators = ml_collections.ConfigDict()

  c.log_every = 50

  c.distill = _distill_config()  # the second stage: a fine-tuned teacher's logits instead of the labels
  # The thesis's augmentation (data/augment.py), with distill.teacher: masking and POS-guided replacement.
  c.augment = augment.augment_config(enabled=False)

  # `python -m minilm_jax.finetune --grid` runs every lr x epochs pair as one run and tabulates them.
  c.grid = ml_collections.ConfigDict()
  c.grid.lrs = (2e-5, 3e-5, 4e-5, 5e-5)
  c.grid.epochs = (3, 4, 5)

  # SQuAD 2.0 windows and decoding (unused by the classification tasks).
  c.doc_stride = 128
  c.n_best = 20
  c.max_answer_length = 30
  c.null_score_threshold = 0.0

  c.seq2seq = _seq2seq_config()
  return c


def _custom_data_config() -> ml_collections.ConfigDict:
  """task=custom: your own data (CSV, TSV, JSON Lines or Parquet files; tasks/custom.py)."""
  c = ml_collections.ConfigDict()
  c.train = ""
  c.dev = ""
  c.text_columns = "text"  # one column, or two comma separated for sentence pairs
  c.label_column = "label"
  c.labels = ""  # class names, comma separated; empty: the training file's label values, sorted
  c.regression = False  # True: one score per example (MSE), as STS-B
  c.metrics = ""  # comma separated, the first picks the grid's best; empty: accuracy,macro_f1 (pearson,spearman)
  return c


def _distill_config() -> ml_collections.ConfigDict:
  """Task-specific distillation (a classification task): the student learns a fine-tuned teacher's
  logits instead of the gold labels, on the training set augmented as the thesis does: the second
  stage after a general distillation (TinyBERT's two stages; finetuning/distillation.py)."""
  c = ml_collections.ConfigDict()
  # A fine-tuning run of the same task, or a comma list of them (their logits averaged, e.g. one per
  # seed); empty: the gold labels (plain fine-tuning).
  c.teacher = ""
  c.objective = "mse"  # mse (the thesis, on logits) or soft_ce (the teacher's probabilities at temperature)
  c.temperature = 1.0
  # Plus the teacher's intermediate layers, by a distillation objective of transfer/objectives.py
  # (tinybert_layerwise: TinyBERT's embeddings, attention scores and hidden states at every layer of
  # the uniform map; hidden_states; layer_to_layer), times `layers_weight`; empty: the logits alone.
  c.layers = ""
  c.layers_weight = 1.0
  c.cache_dir = ""  # the teacher's logits and the augmented set; empty: <workdir>/cache
  return c


def _seq2seq_config() -> ml_collections.ConfigDict:
  """Sequence-to-sequence tasks (tasks/seq2seq.py): max_seq_length is source + target."""
  c = ml_collections.ConfigDict()
  c.target_length = 48  # target tokens trained on and the longest output decoded, the end not counted
  c.label_smoothing = 0.1
  # 0: every target token predicted in one pass from the token before it. > 0: UniLM's masked
  # targets (UniLM's 0.7): that share of the target tokens replaced by [MASK] and predicted, and
  # UniLM's decoding (models/heads.py Seq2SeqLM, tasks/seq2seq.py mask_targets). The paper configs
  # (`seq2seq_config`: qg, xsum, cnndm) set UniLM's 0.7, what the supplementary's tables trained.
  c.mask_prob = 0.0
  c.beam_size = 5  # 1: greedy
  c.length_penalty = 1.0  # hypotheses scored by sum(log p) / length ** length_penalty
  c.min_target_length = 0
  c.no_repeat_ngram = 0  # > 0: block repeating n-grams of this size
  c.qg_context = "paragraph"  # qg: the whole passage, or the sentence holding the answer
  return c


def squad_config(task: str) -> ml_collections.ConfigDict:
  """SQuAD 1.1 or 2.0 (supplementary section 4): max length 384, windows every 128 tokens, batch
  32, lr 6e-5, 3 epochs."""
  c = base_config()
  c.task = task
  c.max_seq_length = 384
  c.batch_size = 32
  c.eval_batch_size = 64
  c.epochs = 3
  c.optimizer.lr = 6e-5
  c.grid.lrs = (4e-5, 6e-5)
  c.grid.epochs = (3,)
  return c


def seq2seq_config(task: str, layers: int = 6) -> ml_collections.ConfigDict:
  """The MiniLM supplementary's sequence-to-sequence settings (section 1.1.2) for a `layers`-layer
  student: question generation batch 32, total length 512, output 48, lr 8e-5 (6 layers) or 3e-5
  (12), 25 epochs, label smoothing 0.1, beam 5, length penalty 1.3; CNN/DailyMail batch 64, total
  length 768, output 160, lr 1.5e-4 / 1e-4, 25 epochs, length penalty 0.7; XSum total length 512,
  output 48, lr 1.5e-4 / 1e-4, 50 / 30 epochs, length penalty 0.9. All three train UniLM's masked
  targets (`seq2seq.mask_prob` 0.7, as the supplementary fine-tunes with UniLM's recipe);
  `--config.seq2seq.mask_prob=0` trains the one-pass form instead."""
  c = base_config()
  c.task = task
  six = layers <= 6
  settings = {  # (batch, total length, output length, lr, epochs, length penalty)
    "qg": (32, 512, 48, 8e-5 if six else 3e-5, 25, 1.3),
    "cnndm": (64, 768, 160, 1.5e-4 if six else 1e-4, 25, 0.7),
    "xsum": (64, 512, 48, 1.5e-4 if six else 1e-4, 50 if six else 30, 0.9),
  }
  (c.batch_size, c.max_seq_length, c.seq2seq.target_length, c.optimizer.lr, c.epochs, c.seq2seq.length_penalty) = (
    settings[task]
  )
  c.eval_batch_size = 32
  c.seq2seq.mask_prob = 0.7
  c.grid.lrs, c.grid.epochs = (c.optimizer.lr,), (c.epochs,)
  return c
