"""Every command in the bash blocks of the README and of docs/ parses as its program would parse
it: the module exists, each flag is one of its flags, the --config file loads with every --config.<field>
override, the fields are in range and every task named exists. (What each command then does is
tested on small files by the test of its program.)"""

import os
import re
import shlex
import sys

import pytest

from conftest import ROOT, forget_parsed_flags, program_module

# A path the README leaves to the reader (`<HF dir or run>`) or computes in the shell (`$(python -c ...)`).
_PLACEHOLDERS = (re.compile(r"\$\(python -c \"[^\"]*\"\)"), re.compile(r"<[^<>]*>"))


def _pages() -> list:
  """The README and every page under docs/ (the .md files: a benchmark's log and models may sit beside them)."""
  return ["README.md"] + sorted(
    os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
  )


def documentation() -> str:
  """The README and every page under docs/, one after another."""
  return "\n".join(open(os.path.join(ROOT, page)).read() for page in _pages())


def readme_commands() -> dict:
  """{program module: [argv, ...]} of the `python -m minilm_jax.<program>` lines of the bash blocks
  of the README and docs/."""
  text = documentation()
  commands = {}
  for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
    for line in block.replace("\\\n", " ").splitlines():
      for pattern in _PLACEHOLDERS:
        line = pattern.sub("placeholder", line)
      if "..." in line:  # a template of commands, not one
        continue
      words = shlex.split(line.replace("[", "").replace("]", ""), comments=True)
      if words[:2] == ["python", "-m"] and words[2].startswith("minilm_jax."):
        commands.setdefault(words[2], []).append(words[3:])
  return commands


@pytest.mark.slow
def test_every_readme_command_parses_with_its_program(monkeypatch):
  commands = readme_commands()
  assert {
    "minilm_jax.train",
    "minilm_jax.finetune",
    "minilm_jax.distill_task",
    "minilm_jax.evaluate",
    "minilm_jax.convert",
  } <= set(commands)
  failures = {}
  for module, argvs in commands.items():
    for argv in argvs:
      try:
        _check_command(module, argv, monkeypatch)
      except Exception as e:  # noqa: BLE001  (each command's failure is reported, not only the first)
        failures[f"{module} {' '.join(argv)}"[:200]] = f"{type(e).__name__}: {e}"[:300]
  assert not failures, failures
  # absl's own flags parse as run_program parses them (its default value: no other test's logging changes).
  module, argvs = next(iter(commands.items()))
  _check_command(module, [*argvs[0], "--alsologtostderr=false"], monkeypatch)


def _check_command(module: str, argv: list, monkeypatch):
  """`argv` parsed as `python -m <module>` parses it (from the repository root), then the checks a
  run makes before any work: the config's fields in range, each task it names known."""
  from minilm_jax.cli.program import with_absl_flags
  from minilm_jax.distill import config as distill
  from minilm_jax.finetuning import config as finetuning
  from minilm_jax.task_distill import config as task_distill
  from minilm_jax.tasks import get_task
  from minilm_jax.training.loop import check_fields

  program = program_module(module.removeprefix("minilm_jax."))
  forget_parsed_flags(program)
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(sys, "argv", ["program", *argv])  # ml_collections reads the overrides from sys.argv
  flag_values = with_absl_flags(program.PROGRAM.flag_values)  # as run_program parses: --verbosity too
  flag_values(sys.argv)
  if "config" in flag_values and flag_values["config"].present:
    config = flag_values.config
    # The ranges of the config's program: task distillation, fine-tuning, or (train, prepare_data, aot's) distillation.
    check_fields(config, (task_distill if "tasks" in config else finetuning if "task" in config else distill).RANGES)
    for name in str(config.get("task", config.get("tasks", ""))).split(","):
      if name and name != "custom":  # a custom task reads its files: its commands are tested on small files
        get_task(name)


@pytest.mark.slow
def test_readme_python_example_runs(tiny_teacher, tmp_path):
  """docs/architecture.md's Python example (load, run, save), on a small checkpoint; and the
  "Extending" section's snippets are valid Python (they are exercised by the tests they name)."""
  text = documentation()
  blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
  example = next(b for b in blocks if "hf.load(" in b)
  code = example.replace("path/to/hf_checkpoint", tiny_teacher).replace('"exported"', repr(str(tmp_path / "out")))
  exec(compile(code, "README.md", "exec"), {})
  assert os.path.exists(tmp_path / "out" / "model.safetensors")
  for block in blocks:
    compile(block if not block.startswith("ClassificationTask") else f"x = [{block}]", "README.md", "exec")


def test_the_readme_is_a_first_screen_whose_links_resolve():
  """At most 200 lines (the rest lives in docs/), and every relative link of the README and the
  pages names a file that exists."""
  assert len(open(os.path.join(ROOT, "README.md")).read().splitlines()) <= 200
  for page in _pages():
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", open(os.path.join(ROOT, page)).read()):
      assert os.path.exists(os.path.join(ROOT, os.path.dirname(page), target)), (page, target)
