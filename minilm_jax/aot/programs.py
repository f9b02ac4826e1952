"""Each program's own step, built from a config and shapes alone (no weights, no data, no network):
the function the program runs, with its mesh, shardings, donation, dtype, accumulation and
chunking, and the abstract arguments it is called with.

- `train`: `distill.step.build_train_step`'s step (state, batch, teacher params, rng);
- `finetune`: `finetuning.run.build_step`'s training step (state, batch, rng, schedule);
- `evaluate`: the same config's prediction step (`evaluation.predictor.Predictor`'s function: the task
  model's outputs, or a sequence-to-sequence task's beam search), at `eval_batch_size`.

The pre-trained model's architecture (the teacher, or fine-tuning's `init`) comes from its
config.json: a local Hugging Face directory, a run's workdir, or, for the hub names the paper
configs use, the copies in `HUB_CONFIGS` below; `--model_shape` stands in for anything else.
"""

import dataclasses
import os
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp

from minilm_jax import runs
from minilm_jax.devices import parallel
from minilm_jax.distill import family
from minilm_jax.distill import step as distill_step
from minilm_jax.errors import UserError
from minilm_jax.finetuning import run as finetuning
from minilm_jax.finetuning.steps import TaskModel
from minilm_jax.models import hf
from minilm_jax.models.embeddings import Pooling
from minilm_jax.models.encoder import EncoderConfig, abstract_params
from minilm_jax.models.flops import LossLayer, distill_flops_per_token, encoder_flops_per_token, parse_shape
from minilm_jax.models.heads import MODEL_INPUTS, LMHead, abstract_model_params, head_kind
from minilm_jax.tasks import get_task
from minilm_jax.training.train_state import Schedule, TrainState
from minilm_jax.transfer.objectives import Masking

# config.json of the hub models the paper configs name (as published on the Hugging Face hub), so
# that their programs compile offline. Fields not given keep `EncoderConfig`'s defaults.
HUB_CONFIGS = {
  "bert-base-uncased": dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                            num_attention_heads=12, intermediate_size=3072),
  "bert-large-uncased": dict(model_type="bert", vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                             num_attention_heads=16, intermediate_size=4096),
  "xlm-roberta-base": dict(model_type="xlm-roberta", vocab_size=250002, hidden_size=768, num_hidden_layers=12,
                           num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
                           type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1),
  "xlm-roberta-large": dict(model_type="xlm-roberta", vocab_size=250002, hidden_size=1024, num_hidden_layers=24,
                            num_attention_heads=16, intermediate_size=4096, max_position_embeddings=514,
                            type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1),
  "microsoft/deberta-v3-base": dict(model_type="deberta-v2", vocab_size=128100, hidden_size=768, num_hidden_layers=12,
                                    num_attention_heads=12, intermediate_size=3072, max_position_embeddings=512,
                                    relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                                    share_att_key=True, pos_att_type="p2c|c2p", layer_norm_eps=1e-7,
                                    max_relative_positions=-1, position_biased_input=False, type_vocab_size=0,
                                    pad_token_id=0),
  "sentence-transformers/all-mpnet-base-v2": dict(model_type="mpnet", vocab_size=30527, hidden_size=768,
                                                  num_hidden_layers=12, num_attention_heads=12,
                                                  intermediate_size=3072, max_position_embeddings=514,
                                                  layer_norm_eps=1e-5, relative_attention_num_buckets=32,
                                                  pad_token_id=1),
  "answerdotai/ModernBERT-base": dict(model_type="modernbert", vocab_size=50368, hidden_size=768, num_hidden_layers=22,
                                      num_attention_heads=12, intermediate_size=1152, max_position_embeddings=8192,
                                      hidden_activation="gelu", norm_eps=1e-5, local_attention=128,
                                      global_attn_every_n_layers=3, global_rope_theta=160000.0,
                                      local_rope_theta=10000.0, pad_token_id=50283),
}  # fmt: skip

# Token ids only the masked-input objectives and beam search's banned tokens read; they are
# constants of the program and change none of its shapes. BERT's: [PAD], [UNK], [CLS], [SEP], [MASK].
_STAND_IN_SPECIALS = (0, 100, 101, 102, 103)


@dataclasses.dataclass(frozen=True)
class Program:
  name: str
  step: Callable  # jitted
  args: tuple  # jax.ShapeDtypeStruct trees with shardings
  tokens_per_step: int
  analytic_flops_per_step: float | None  # None where no analytic count is defined
  batch_field: str  # the config field that sets the global batch
  global_batch: int
  mesh: jax.sharding.Mesh


def pretrained_config(path: str, what: str, model_shape: str = "") -> EncoderConfig:
  """The architecture of the model at `path` from its config.json alone."""
  if model_shape:
    return parse_shape(model_shape)
  if path in HUB_CONFIGS:
    return hf.config_from_hf(HUB_CONFIGS[path])
  if os.path.exists(path):
    return runs.encoder_config_of(path, what)
  raise UserError(
    f"{what} {path or '(empty)'} is not a local directory, a run or a hub model whose shape is known here "
    f"({', '.join(HUB_CONFIGS)}): set it, or give the shape with --model_shape LAYERSxHIDDEN[xHEADS]"
  )


def _rng(mesh):
  key = jax.eval_shape(lambda: jax.random.key(0))
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=parallel.replicated(mesh))


def _inputs(mesh, batch: int, length: int) -> dict:
  sharding = parallel.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct((batch, length), jnp.int32, sharding=sharding) for k in MODEL_INPUTS}


class _Tokenizer:
  """What the steps read of a tokenizer when there is none to load (a hub name, offline)."""

  all_special_ids = _STAND_IN_SPECIALS
  pad_token_id = 0  # UniLM's masked targets leave padding unmasked
  sep_token_id = 102
  mask_token_id = 103


def _tokenizer(path: str):
  if os.path.isdir(path):
    return runs.load_tokenizer_of(path)
  return _Tokenizer()


def _abstract_mlm_head(config: EncoderConfig):
  hidden, embedding = jnp.zeros((1, config.hidden_size)), jnp.zeros((config.vocab_size, config.hidden_size))
  return jax.eval_shape(lambda: LMHead(config).init(jax.random.key(0), hidden, embedding)["params"])


def train(config, devices, model_shape: str = "") -> Program:
  teacher_config = pretrained_config(config.teacher.path, "teacher.path", model_shape).replace(dtype=config.dtype)
  if model_shape:  # a teacher assistant not trained yet: the student's model type and vocabulary are its own
    teacher_config = teacher_config.replace(model_type=config.student.model_type, vocab_size=config.student.vocab_size)
  mesh = parallel.make_mesh(config.mesh.data, 1, devices)
  tokenizer = _tokenizer(config.teacher.path)
  masking = Masking.of(tokenizer)

  def pooling(c):
    if os.path.isdir(config.teacher.path):  # a hub name is never looked up: offline, mean pooling stands in
      return distill_step.teacher_pooling(c)
    return Pooling(max_seq_length=config.data.max_seq_length)

  members = family.members(config)
  poolings = {n: pooling(c) for n, c in members.items()}
  built = distill_step.build_train_step(members, teacher_config, mesh, masking, poolings)
  train_step, state = built.jitted, built.abstract_state()
  replicated = parallel.replicated(mesh)
  teacher = abstract_params(teacher_config)
  if any(s.objective.needs.mlm_head for s in built.students.values()):  # soft labels: never a family's
    teacher = {**teacher, "mlm_head": _abstract_mlm_head(teacher_config)}
  batch, length = config.batch_size, config.data.max_seq_length
  args = (
    parallel.placed(state, replicated),
    _inputs(mesh, batch, length),
    parallel.placed(teacher, replicated),
    _rng(mesh),
    built.schedules,
  )
  steps = list(built.students.values())
  flops = _minilm_flops(steps[0], teacher_config, batch, length) if len(steps) == 1 else None
  return Program("train", train_step, args, batch * length, flops, "batch_size", batch, mesh)


def _minilm_flops(step, teacher_config: EncoderConfig, batch: int, length: int) -> float | None:
  """The analytic FLOPs of one student's step by MiniLM's relations at one layer pair, without the
  embedding term; None for any other objective (or several students), which has no analytic count."""
  objective = step.objective
  if objective.name != "minilm" or len(objective.pairs) != 1 or objective.embedding_weight != 0:
    return None
  student_layer, teacher_layer = objective.pairs[0]
  per_token = distill_flops_per_token(
    LossLayer(teacher_config, teacher_layer),
    LossLayer(step.student.config, student_layer),
    length,
    len(objective.relations),
  ) + _rematerialised_scores_flops_per_token(step.student.config, student_layer, length)
  return float(per_token) * batch * length


def _finetuning_step(config, devices, model_shape: str):
  task = get_task(config.task, config)
  head = task.head(config)
  encoder = pretrained_config(config.init, "init", model_shape).replace(dtype=config.dtype)
  encoder = finetuning.fit_positions(config, encoder, head)
  mesh = parallel.make_mesh(config.mesh.data, config.mesh.model, devices)
  parts = TaskModel(task, head, encoder, _tokenizer(config.init))
  step = finetuning.build_step(config, parts, mesh)
  return task, head, mesh, step


def _task_columns(task, head: dict, config, mesh, batch: int) -> dict:
  """The abstract batch of a task's training columns."""
  sharding = parallel.batch_sharding(mesh)
  columns = _inputs(mesh, batch, config.max_seq_length)
  shape: tuple[int, ...]
  for name in task.train_columns:
    if name in columns:
      continue
    if name == "labels":  # sequence-to-sequence: the target's tokens and its end token
      shape, dtype = (batch, config.seq2seq.target_length + 1), jnp.int32
    elif name in ("label", "start_positions", "end_positions"):
      shape, dtype = (batch,), head_kind(head).label_dtype(head)
    else:
      raise UserError(f"task {task.name}: aot does not know the shape of its column {name!r}")
    columns[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  return columns


def _rematerialised_scores_flops_per_token(config, layers: int, length: int) -> int:
  """The attention scores that the backward pass of a layer with attention dropout recomputes (our
  flash kernel's backward on GPUs, `kernels.attention`; the rematerialised explicit path on TPUs,
  `models.encoder._RematerialisedLayer`), one [L, L] product per layer: work that
  keeping the probabilities out of memory asks for, so the analytic count includes it."""
  return layers * 2 * length * config.hidden_size if config.attention_dropout > 0 else 0


def _encoder_flops(step, head, length: int, training: bool) -> float | None:
  """Per-token FLOPs of the encoder, forward, or forward and backward (3 times) with the scores
  rematerialised in training; a sequence-to-sequence model's output layer is extra, and not
  counted (None)."""
  if head_kind(head).generates:
    return None
  config = step.encoder_config
  if not training:
    return float(encoder_flops_per_token(config, length))
  return float(
    3 * encoder_flops_per_token(config, length)
    + _rematerialised_scores_flops_per_token(config, config.num_layers, length)
  )


def finetune(config, devices, model_shape: str = "") -> Program:
  task, head, mesh, step = _finetuning_step(config, devices, model_shape)
  # The schedule is an argument: its length and learning rate change no shape of the program.
  schedule = Schedule.of(config.optimizer, 1000)
  tx = step.optimizer(schedule)
  abstract = jax.eval_shape(partial(TrainState.fresh, tx=tx), abstract_model_params(step.encoder_config, head))
  state = parallel.placed(abstract, step.state_shardings)
  batch, length = config.batch_size, config.max_seq_length
  rates = parallel.placed(jax.eval_shape(lambda: schedule), parallel.replicated(mesh))
  args = (state, _task_columns(task, head, config, mesh, batch), _rng(mesh), rates)
  per_token = _encoder_flops(step, head, length, training=True)
  flops = None if per_token is None else per_token * batch * length
  return Program("finetune", step.train_step, args, batch * length, flops, "batch_size", batch, mesh)


def evaluate(config, devices, model_shape: str = "") -> Program:
  task, head, mesh, step = _finetuning_step(config, devices, model_shape)
  batch, length = config.eval_batch_size, config.max_seq_length
  predictor = step.predictor(batch)
  params = parallel.placed(abstract_model_params(step.encoder_config, head), step.state_shardings.params)
  per_token = _encoder_flops(step, head, length, training=False)
  flops = None if per_token is None else per_token * batch * length
  return Program(
    "evaluate",
    predictor.forward,
    (params, _inputs(mesh, batch, length)),
    batch * length,
    flops,
    "eval_batch_size",
    batch,
    mesh,
  )


def largest_batch(peak_at: Callable[[int], float], start: int, unit: int, capacity: float, limit: int = 1 << 24) -> int:
  """The largest multiple of `unit` (the devices the batch splits over, times the accumulation
  steps) whose `peak_at(batch)` (bytes per device, one compile each; NaN when the compiler said
  only "too large") is at most `capacity`, to within an eighth; 0 when `unit` does not fit.

  Memory is close to affine in the batch (the state is fixed, the activations grow with it), so
  after `start` and its double (or half) each guess is where the line through the last two
  measured points meets `capacity`, a little below it, kept inside the bracket found so far
  (bisection where it falls outside or a point has no figure). A compile takes minutes at a
  paper's shape: this needs three or four where doubling then bisecting took six or more."""
  measured: dict[int, float] = {}  # batch -> bytes, for the compiles that gave a figure
  low, high = 0, None  # the largest batch known to fit, the smallest known not to

  def line_guess():
    """Where the line through the two measured points nearest `low` meets `capacity` (None: no line)."""
    if len(measured) < 2:
      return None
    (b0, p0), (b1, p1) = sorted(measured.items(), key=lambda kv: abs(kv[0] - low))[:2]
    if (p1 - p0) * (b1 - b0) <= 0:
      return None
    return int((b0 + (capacity - p0) * (b1 - b0) / (p1 - p0)) * 0.98) // unit * unit

  def next_probe():
    if high is not None and high - low <= max(unit, low // 8):
      return None
    upper = limit // unit * unit if high is None else high - unit
    guess, least = line_guess(), low + max(unit, low // 8 // unit * unit) if low else unit
    if guess is None or (high is not None and guess >= high):
      guess = low * 2 if high is None else (low + high) // 2 // unit * unit
    guess = min(max(guess, least), upper)  # at least an eighth above what fits: closes the bracket
    return guess if low < guess <= upper else None

  probe = min(max(unit, start // unit * unit), limit // unit * unit)
  while probe is not None:
    peak = peak_at(probe)
    if peak == peak:  # a figure, not NaN
      measured[probe] = peak
    if peak <= capacity:
      low = probe
    else:
      high = probe
    probe = next_probe()
  return low


PROGRAMS = {"train": train, "finetune": finetune, "evaluate": evaluate}


def is_distillation_config(config) -> bool:
  return "teacher" in config and "student" in config


def default_program(config) -> str:
  return "train" if is_distillation_config(config) else "finetune"


def check_program(name: str, config):
  if name not in PROGRAMS:
    raise UserError(f"unknown --program {name!r}: use one of {', '.join(PROGRAMS)}")
  if (name == "train") != is_distillation_config(config):
    kind = "a distillation" if is_distillation_config(config) else "a fine-tuning"
    raise UserError(
      f"--program {name} does not run {kind} config: use --program "
      f"{'train' if is_distillation_config(config) else 'finetune or evaluate'}"
    )
