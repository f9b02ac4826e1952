"""Captions a test reads wherever they stand: every dotted `module.name` and every backticked file of
the repository in docs/*.md (code blocks included), the README and the package's docstrings resolves
to something that exists, and the docs' Python examples import and name what exists. A caption
cannot keep a module, a function or a file that moved or was renamed."""

import ast
import builtins
import dataclasses
import glob
import importlib
import importlib.util
import os
import re

import pytest

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "minilm_jax")
DOCUMENTS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
# The repository's own folders: a backticked path under one of them is a file of the repository.
_REPO_FOLDERS = ("minilm_jax/", "configs/", "docs/", "tests/", "launch/", ".ci/")
# Files a run, an export or a user writes, named by their kind: not files of the repository.
_EXTENSIONS = (
  "json jsonl py md txt safetensors bin lock tsv csv sh gz sbatch npz pkl yaml toml ini png pdf html model "
  "tar zip xml spm vec noun verb adj adv"  # the last: WordNet's database files (`data.noun`)
).split()
_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
_BACKTICKED = re.compile(r"`([^`\n]+)`")
_CODE_BLOCK = re.compile(r"```(\w*)\n(.*?)```", re.S)


def _modules() -> dict:
  """{every dotted suffix of a module's or package's name (`step`, `distill.step`, ...): [full names]}."""
  out: dict = {}
  for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if rel[-1] == "__init__":
      rel = rel[:-1]
    if rel[-1] == "__main__":
      continue
    full = ".".join(rel)
    for i in range(len(rel)):
      out.setdefault(".".join(rel[i:]), []).append(full)
  return out


def _classes() -> dict:
  """{name of a top-level class of the package: [its module]}."""
  out: dict = {}
  for full in {m for ms in _modules().values() for m in ms}:
    path = os.path.join(ROOT, *full.split("."))
    path = path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__init__.py")
    for node in ast.parse(open(path).read()).body:
      if isinstance(node, ast.ClassDef):
        out.setdefault(node.name, []).append(full)
  return out


MODULES, CLASSES = _modules(), _classes()


def _config_paths() -> set:
  """Every field path of the programs' configs (`data.max_seq_length`, `loss.objective`): a caption
  naming one names a config field, not a module's attribute."""
  from minilm_jax.distill import config as distill_config
  from minilm_jax.finetuning import config as finetuning_config
  from minilm_jax.task_distill import config as task_config

  paths = set()
  for config in (distill_config.base_config(), finetuning_config.base_config(), task_config.task_distillation_config()):
    stack = [("", config.to_dict())]
    while stack:
      prefix, block = stack.pop()
      for key, value in block.items():
        paths.add(prefix + key)
        if isinstance(value, dict):
          stack.append((prefix + key + ".", value))
  return paths


def _has(obj, name: str) -> bool:
  """Whether `obj` has attribute `name`, a dataclass's field (with or without a default) included."""
  if hasattr(obj, name):
    return True
  if isinstance(obj, type):
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    return name in fields or name in getattr(obj, "__annotations__", {})
  return False


def _source(full: str) -> str:
  path = os.path.join(ROOT, *full.split("."))
  return path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__init__.py")


def _module_names(full: str) -> dict:
  """{name: its node} of what a module of the package defines or imports at its top level, and its
  submodules (read from the source, not imported: the programs define flags when imported)."""
  names: dict = {}
  for node in ast.parse(open(_source(full)).read()).body:
    if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
      names[node.name] = node
    elif isinstance(node, ast.Assign | ast.AnnAssign):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        for n in ast.walk(target):
          if isinstance(n, ast.Name):
            names[n.id] = node
    elif isinstance(node, ast.ImportFrom | ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name.split(".")[0]] = (node, alias)
  if _source(full).endswith("__init__.py"):
    folder = os.path.dirname(_source(full))
    for entry in os.listdir(folder):
      if entry.endswith(".py") or os.path.isfile(os.path.join(folder, entry, "__init__.py")):
        names.setdefault(entry.removesuffix(".py"), f"{full}.{entry.removesuffix('.py')}")
  return names


def _class_names(node: ast.ClassDef) -> set | None:
  """The attributes a class of the package defines (its body, its instances' `self.x`), with its
  bases' of the package; None where a base is not ours (anything may be inherited)."""
  names = set()
  for n in ast.walk(node):
    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
      names.add(n.name)
    elif isinstance(n, ast.AnnAssign | ast.Assign):
      for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
        if isinstance(target, ast.Name):
          names.add(target.id)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
          names.add(target.attr)
  for base in node.bases:
    base_name = base.id if isinstance(base, ast.Name) else None
    if base_name in CLASSES:
      inherited = _class_names(_class_node(CLASSES[base_name][0], base_name))
      if inherited is None:
        return None
      names |= inherited
    elif base_name != "object":
      return None
  return names


def _class_node(full: str, name: str) -> ast.ClassDef:
  node = _module_names(full)[name]
  assert isinstance(node, ast.ClassDef)
  return node


def _follows(full: str, parts: list) -> bool:
  """Whether `parts` are attributes of the module `full`, as far as modules and classes go."""
  if not parts:
    return True
  names = _module_names(full)
  found = names.get(parts[0])
  if found is None:
    return False
  if isinstance(found, str):  # a submodule
    return _follows(found, parts[1:])
  if isinstance(found, tuple):  # imported: followed when the package is where it comes from
    node, alias = found
    source = node.module if isinstance(node, ast.ImportFrom) else alias.name
    if node.level or not (source or "").startswith("minilm_jax"):
      return True
    if f"{source}.{alias.name}" in MODULES.get(f"{source}.{alias.name}".split("minilm_jax.", 1)[-1], []):
      return _follows(f"{source}.{alias.name}", parts[1:])
    return _follows(source, [alias.name, *parts[1:]])
  if isinstance(found, ast.ClassDef) and len(parts) > 1:
    attributes = _class_names(found)
    return attributes is None or parts[1] in attributes
  return True  # a function or a value: what follows is its own business


def _resolves(token: str) -> bool | None:
  """Whether a dotted `token` whose head names a module (or a class) of the package resolves to
  something that exists: None when it names none of ours (`jax.jit`, a variable's attribute)."""
  parts = token.split(".")
  for cut in range(len(parts), 0, -1):
    head = ".".join(parts[:cut])
    if head in MODULES:
      return any(_follows(full, parts[cut:]) for full in MODULES[head])
  if parts[0] in CLASSES:
    return any(_follows(full, parts) for full in CLASSES[parts[0]])
  return None


def _all_class_attributes() -> set:
  names = set()
  for name, modules in CLASSES.items():
    for module in modules:
      names |= _class_names(_class_node(module, name)) or set()
  return names


CLASS_ATTRIBUTES = _all_class_attributes()


def _checked_dotted(token: str, config_paths: set) -> str | None:
  """The problem with a backticked dotted name, None when it resolves or is none of the package's."""
  token = token.strip().rstrip("()")
  if not _DOTTED.match(token) or token.rsplit(".", 1)[1] in _EXTENSIONS:
    return None
  if token.split(".")[0] in ("config", "c") or token in config_paths:
    return None
  if any(token.startswith(p + ".") for p in config_paths if "." not in p and p in ("evaluators",)):
    if _resolves(token) is False:
      return None  # a named evaluator of a config (`evaluators.wordnet`)
  if _resolves(token) is not False:
    return None
  head, attribute = token.split(".")[:2]
  if f"{head}.{attribute}" not in MODULES and attribute[0].islower() and attribute in CLASS_ATTRIBUTES:
    return None  # a variable named as a module (`run.mesh`, `record.multi_task`): an attribute of one of our classes
  return f"`{token}` names nothing of the package"


def _checked_path(token: str, where: str) -> str | None:
  """The problem with a backticked file of the repository, None when it exists or is no file of it."""
  token = token.strip().split(":")[0].split(" ")[0]
  if any(c in token for c in "<>{}$=,()'\"") or token.startswith(("-", "/", "~", "http")):
    return None
  looks_like_ours = token.startswith(_REPO_FOLDERS) or (token.endswith(".py") and "/" not in token)
  if not looks_like_ours:
    return None
  here = os.path.dirname(where)
  places = [os.path.join(ROOT, token), os.path.join(here, token), os.path.join(PACKAGE, token)]
  if "/" not in token:  # a module's file by its name alone: anywhere in the repository
    places += glob.glob(os.path.join(ROOT, "**", token), recursive=True)
  if any(glob.glob(p) for p in places) or _ignored(token):
    return None
  return f"`{token}` is no file of the repository"


def _ignored(token: str) -> bool:
  """Whether git ignores `token`: an output a program writes into the checkout (`docs/*_models/`)."""
  import subprocess

  return subprocess.run(["git", "check-ignore", "-q", token.rstrip("/") + "/x"], cwd=ROOT).returncode == 0


def _docstrings() -> list:
  """(file, docstring) of every module, class and function of the package."""
  out = []
  for path in sorted(glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)):
    tree = ast.parse(open(path).read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(node)
        if doc:
          out.append((path, doc))
  return out


def _captions() -> list:
  """(file, text outside code blocks, code blocks as (language, code)) of every doc and docstring."""
  out = [(path, text, []) for path, text in _docstrings()]
  for path in DOCUMENTS:
    text = open(path).read()
    blocks = _CODE_BLOCK.findall(text)
    out.append((path, _CODE_BLOCK.sub("", text), blocks))
  return out


def test_every_backticked_module_name_and_file_resolves():
  config_paths = _config_paths()
  problems = []
  for path, text, blocks in _captions():
    tokens = _BACKTICKED.findall(text)
    for language, code in blocks:  # a shell block's commands: their programs, files and modules
      if language != "python":
        tokens += re.findall(r"-m\s+([\w.]+)", code) + re.findall(r"[\s=](\S+\.py)\b", code)
    for token in tokens:
      problem = _checked_dotted(token, config_paths) or _checked_path(token, path)
      if problem:
        problems.append(f"{os.path.relpath(path, ROOT)}: {problem}")
  assert not problems, "\n".join(sorted(set(problems)))


def _python_examples() -> list:
  return [
    pytest.param(code, id=f"{os.path.basename(path)}:{i}")
    for path in DOCUMENTS
    for i, (language, code) in enumerate(_CODE_BLOCK.findall(open(path).read()))
    if language == "python"
  ]


def _bindings(tree) -> tuple:
  """({name: what the example's imports bind to it}, {every name it defines}): its imports run."""
  bound, defined = {}, set(dir(builtins))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        importlib.import_module(alias.name)
        bound[alias.asname or alias.name.split(".")[0]] = importlib.import_module(alias.name.split(".")[0])
    elif isinstance(node, ast.ImportFrom):
      module = importlib.import_module(node.module)
      for alias in node.names:
        if not _has(module, alias.name):
          module_name = f"{node.module}.{alias.name}"
          assert importlib.util.find_spec(module_name), f"{node.module} has no {alias.name}"
          bound[alias.asname or alias.name] = importlib.import_module(module_name)
        else:
          bound[alias.asname or alias.name] = getattr(module, alias.name)
    elif isinstance(node, ast.FunctionDef | ast.ClassDef):
      defined.add(node.name)
    elif isinstance(node, ast.arg):
      defined.add(node.arg)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      defined.add(node.id)
  return bound, defined


def _check_attributes(node: ast.Attribute, bound: dict):
  """The attributes `node` reads of what the example imported exist, as far as modules and classes go."""
  chain, root = [], node
  while isinstance(root, ast.Attribute):
    chain.insert(0, root.attr)
    root = root.value
  if not (isinstance(root, ast.Name) and root.id in bound):
    return
  obj = bound[root.id]
  for name in chain:
    if not (isinstance(obj, type) or type(obj).__name__ == "module"):
      return
    assert _has(obj, name), f"{root.id}.{'.'.join(chain)}: {obj!r} has no {name}"
    obj = getattr(obj, name, None)


@pytest.mark.parametrize("code", _python_examples())
def test_every_python_example_imports_and_names_what_exists(code):
  """Each ```python block of the docs parses, its imports import, every attribute it reads of what
  it imported exists, and every name it uses is imported, defined in it or a builtin."""
  tree = ast.parse(code)
  bound, defined = _bindings(tree)
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
      assert node.id in bound or node.id in defined, f"the example uses {node.id}, which it neither imports nor defines"
    if isinstance(node, ast.Attribute):
      _check_attributes(node, bound)
