"""What one `bench students` run measures and how (`Settings`): the teacher and the student's shape,
the first stage's distillation, the fine-tunings, the second stages' augmentation, the results."""

import dataclasses

from minilm_jax.errors import UserError

# One task per source of text (WordNet's definitions, Rotten Tomatoes snippets, tweets), then a task
# of sentence pairs (a definition and an example sentence: is the word used in this sense?) and a
# regression (the snippets' mean human rating, Pearson and Spearman).
DEFAULT_TASKS = ("wordnet_supersense", "vader_movies", "vader_tweets", "wordnet_examples", "vader_movies_rating")


@dataclasses.dataclass(frozen=True)
class Settings:
  """A `bench students` run. `results`: a JSON Lines file every measurement is appended to as it is
  done (a run given the same file measures only what it lacks); `seeds`: fine-tunings per model and
  task, with seeds `first_seed` on (0: the frozen probes alone); `size_factor`: the second stages'
  augmented sets, at most that many times the training set; `logged_only`: the rows of what
  `results` holds, measuring nothing."""

  models: tuple
  teacher: str = ""  # a Hugging Face directory or run; "": the real all-MiniLM-L6-v2
  student: str = "3x384"  # layers x width
  steps: int = 300  # the first stage's distillation: its steps, batch, length, corpus, relation heads
  batch: int = 64
  length: int = 64
  corpus: str = "demo"
  relation_heads: int = 12
  tasks: tuple = DEFAULT_TASKS
  seeds: int = 3
  first_seed: int = 0
  finetune_epochs: int = 3
  finetune_lr: float = 1e-4
  size_factor: int = 10
  results: str = ""
  logged_only: bool = False

  @property
  def shape(self) -> tuple:
    """The student's (layers, width)."""
    try:
      layers, width = (int(n) for n in self.student.split("x"))
    except ValueError:
      raise UserError(f"--student {self.student}: give layers x width, e.g. 3x384") from None
    return layers, width

  @property
  def seed_range(self) -> range:
    return range(self.first_seed, self.first_seed + self.seeds)
