"""Teacher vs student attention maps for a sentence, to PNG:

  python -m minilm_jax.attention_maps --teacher <HF dir or run> --student <run or HF dir> \
      --sentence "..." --out maps.png [--teacher_layer -1] [--student_layer -1] [--heads 0,1,2,3]
"""

from typing import cast

import jax.numpy as jnp
from absl import flags

from minilm_jax import runs
from minilm_jax.cli.program import Program, run_program
from minilm_jax.distill.step import resolve_layer
from minilm_jax.errors import UserError
from minilm_jax.models.encoder import Encoder, EncoderOutput
from minilm_jax.reports.plots import attention_figure

PROGRAM = Program()
_TEACHER = flags.DEFINE_string(
  "teacher", None, "Teacher: a Hugging Face directory or a run's workdir.", flag_values=PROGRAM.flag_values
)
_STUDENT = flags.DEFINE_string(
  "student", None, "Student: a run's workdir or a Hugging Face directory.", flag_values=PROGRAM.flag_values
)
_SENTENCE = flags.DEFINE_string(
  "sentence",
  "The student learns to attend where its teacher attends.",
  "The sentence.",
  flag_values=PROGRAM.flag_values,
)
_OUT = flags.DEFINE_string("out", "attention_maps.png", "The PNG file to write.", flag_values=PROGRAM.flag_values)
_TEACHER_LAYER = flags.DEFINE_integer("teacher_layer", -1, "Teacher layer (-1: last).", flag_values=PROGRAM.flag_values)
_STUDENT_LAYER = flags.DEFINE_integer("student_layer", -1, "Student layer (-1: last).", flag_values=PROGRAM.flag_values)
_HEADS = flags.DEFINE_list("heads", ["0", "1", "2", "3"], "Attention heads to draw.", flag_values=PROGRAM.flag_values)


def main(argv):
  del argv
  maps, tokens = {}, None
  for title, path, layer in (
    ("teacher", _TEACHER.value, _TEACHER_LAYER.value),
    ("student", _STUDENT.value, _STUDENT_LAYER.value),
  ):
    config, params, tokenizer = runs.load_encoder(path or "", what=f"--{title}")[:3]
    # verbose=False: a sentence past the tokenizer's own maximum is this program's one-line error
    # below, not transformers' warning before it.
    ids = tokenizer([_SENTENCE.value], return_tensors="np", verbose=False)
    tokens = tokenizer.convert_ids_to_tokens(ids["input_ids"][0])
    if len(tokens) > config.max_position_embeddings:
      raise UserError(
        f"the sentence is {len(tokens)} tokens long but the {title} has {config.max_position_embeddings} "
        f"positions: give a shorter --sentence (a map of that many tokens is unreadable anyway)"
      )
    inputs = (jnp.asarray(ids[k]) for k in ("input_ids", "attention_mask"))
    out = cast(EncoderOutput, Encoder(config).apply({"params": params}, *inputs, return_attention=True))
    maps[f"{title} L{resolve_layer(layer, config.num_layers, f'--{title}_layer') + 1}"] = out.layers[layer].attention[0]
    heads = [int(h) for h in _HEADS.value]
    if max(heads) >= config.num_heads:
      raise UserError(f"--heads {_HEADS.value} but the {title} has {config.num_heads} heads")
  attention_figure(maps, tokens, heads).savefig(_OUT.value, dpi=150)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  run_program(main, PROGRAM)
