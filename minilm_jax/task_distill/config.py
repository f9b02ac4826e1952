"""The defaults of task-specific and multi-task distillation (the thesis); `configs/task/*.py`
start from these."""

import ml_collections
from ml_collections import config_dict

from minilm_jax.data import augment
from minilm_jax.training.loop import TRAINING_RANGES, Above
from minilm_jax.training.train_state import OPTIMIZER_RANGES

# The fields of `task_distillation_config` that have a range (`loop.check_fields`): (least, bound
# to stay below).
RANGES = {
  **TRAINING_RANGES,
  **OPTIMIZER_RANGES,
  "temperature": (Above(0), None),  # the logits are divided by it
  "max_seq_length": (2, None),  # [CLS] and [SEP]
  "optimizer.rho": (0, None),
  **dict.fromkeys(("student.embed_dim", "student.hidden", "student.fc", "student.num_layers"), (1, None)),
  "student.dropout": (0, 1),
  "student.max_words": (0, None),  # 0: every word of the vectors file
  **augment.RANGES,
}


def task_distillation_config() -> ml_collections.ConfigDict:
  """Task-specific distillation (thesis chapter 3): a fine-tuned teacher into a BiLSTM, on the
  training set augmented 10x. `configs/task/*.py` override what their setting changes; several
  `tasks` make it multi-task distillation (chapter 4)."""
  c = ml_collections.ConfigDict()
  c.tasks = "sst2"  # a task, or a comma list of tasks for multi-task distillation (MKD)
  # Fine-tuning run workdirs, comma separated: each task takes its teacher logits from the first run
  # fine-tuned on it. The first run's tokenizer (WordPiece) is the student's vocabulary.
  c.teacher = ""
  # The tasks' data folder (GLUE TSV files; WordNet's dict folder), or a comma list of one per task;
  # empty: each task's default.
  c.data_dir = ""
  c.max_seq_length = 64
  c.objective = "mse"  # mse (teacher logits), soft_ce (teacher probabilities at `temperature`), hard (gold labels)
  c.temperature = 1.0

  c.student = ml_collections.ConfigDict()
  c.student.kind = "bilstm"  # bilstm (siamese on pairs), biattentive, transformer
  c.student.embed_dim = 300
  c.student.hidden = 150  # LSTM units per direction
  c.student.fc = 200  # each task head: Dense(fc) + ReLU -> Dense(labels)
  c.student.num_layers = 3  # transformer: the first layers of `init`
  c.student.dropout = 0.1  # transformer
  # transformer: a run, HF dir or hub id to take the embeddings, first layers and tokenizer from (the
  # thesis: bert-base-uncased, under BERT-large teachers); empty: the first teacher's encoder.
  c.student.init = ""
  # A task-distillation run whose student goes on here (MKD's last stage, per task): its student
  # block, tokenizer, body and the heads of `tasks` replace this config's and the fresh start.
  c.student.from_run = ""
  # The LSTMs' words (thesis section 3.4.1): a local word2vec (.bin, or text) or GloVe text file;
  # empty: the first teacher's WordPiece vocabulary, embeddings learnt from scratch. See
  # data/word_vectors.py for the vocabulary it builds. embed_dim must be the file's dimension.
  c.student.word_vectors = ""
  c.student.multichannel = True  # with word_vectors: a frozen copy of the vectors beside the tuned one (Kim 2014)
  c.student.max_words = 100_000  # with word_vectors: the file's most frequent words kept, plus the training words

  c.augment = augment.augment_config(enabled=True)  # thesis section 3.3; not used by the "hard" objective

  c.batch_size = 50
  c.eval_batch_size = 128
  c.epochs = 10
  c.seed = 0
  # Learning rates, comma separated: one run each in <workdir>/lr<rate>, the lowest mean dev loss
  # chosen (<workdir>/lr_grid.json). Empty: one run at optimizer.lr.
  c.lr_grid = ""
  c.cache_dir = ""  # teacher logits of the (augmented) training sets; empty: <workdir>/cache

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adadelta"  # the thesis's BiLSTM: AdaDelta, lr 1.0, rho 0.95; MKD: adam, lr 5e-4, clip 1
  c.optimizer.lr = 1.0
  c.optimizer.rho = 0.95
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.clip_norm = 0.0  # 0: no clipping
  c.optimizer.accumulate_steps = 1  # micro-batches per batch, gradients averaged before one update

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 1000
  c.checkpoint.keep = 1

  c.log_every = 50
  return c


def mkd_config() -> ml_collections.ConfigDict:
  """Multi-task distillation (thesis section 4.3.2): bi-attentive LSTM with 256 units, task layers
  512, Adam lr 5e-4, batch 128, 16 epochs, gradient norm clipped to 1, augmentation by masking
  only (the thesis found POS-guided replacement no consistent help there)."""
  c = task_distillation_config()
  c.tasks = "wordnet_supersense,wordnet_examples"
  c.student.kind = "biattentive"
  c.student.hidden, c.student.fc = 256, 512
  c.optimizer.name, c.optimizer.lr, c.optimizer.clip_norm = "adam", 5e-4, 1.0
  c.batch_size, c.epochs = 128, 16
  c.augment.p_pos = 0.0
  return c


def student_from_run(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`c` with its student block left to `student.from_run` (MKD's last stage): every field but
  `from_run` unset, to be filled with the run's own value; a field given on the command line must
  equal the run's (`task_distill.run`)."""
  c.student = ml_collections.ConfigDict(
    {k: (v if k == "from_run" else config_dict.placeholder(type(v))) for k, v in c.student.items()}
  )
  return c


def left_to_run(student: ml_collections.ConfigDict) -> bool:
  """Whether a student block is left to `student.from_run` (`student_from_run`) and still unfilled."""
  return all(v is None for k, v in student.items() if k != "from_run")
