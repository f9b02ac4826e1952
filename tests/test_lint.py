"""The linter and formatter (ruff, configured in ruff.toml) pass on the package, its tests and
configs, the type checker (mypy, configured in mypy.ini) on the package, and the package's import
graph is clean."""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff_finds_nothing(command):
  """`ruff check` (pyflakes, line length, import order, bugbear, pyupgrade) and `ruff format --check`:
  fix with `ruff format` and `ruff check --fix`."""
  proc = subprocess.run(
    [sys.executable, "-m", "ruff", *command, "minilm_jax", "tests", "configs"], cwd=ROOT, capture_output=True, text=True
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_type_checker_finds_nothing():
  """mypy over the package, as mypy.ini configures it (mypy rather than pyright: a wheel that runs
  offline, where pyright fetches Node.js on first use). Fix what it reports, or say in the code why
  a value's type is narrower than it can see (`typing.cast`, an `assert` with its reason)."""
  proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stdout + proc.stderr


def _imports(path: str, modules) -> tuple:
  """(module-level imports, imports inside functions) of the package's modules by one source file:
  `from minilm_jax.x import y` imports module minilm_jax.x.y when there is one, else minilm_jax.x."""
  top, local = set(), set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      found = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names]
    else:
      continue
    (top if node.col_offset == 0 else local).update(n for n in found if n.startswith("minilm_jax"))
  return top, local


def _modules() -> dict:
  """{module name: source path} of the package."""
  out = {}
  for path in glob.glob(os.path.join(ROOT, "minilm_jax", "**", "*.py"), recursive=True):
    name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
  return out


def _first_cycle(graph) -> list:
  """The first cycle of `graph` ({node: the nodes it points to}) found by a depth-first walk in
  sorted order, as its nodes with the first repeated at the end; [] when there is none."""
  state: dict = {}

  def visit(node, trail):
    if state.get(node) == "done":
      return []
    if state.get(node) == "open":
      return trail[trail.index(node) :] + [node]
    state[node] = "open"
    for other in sorted(graph[node]):
      found = visit(other, trail + [node])
      if found:
        return found
    state[node] = "done"
    return []

  for node in sorted(graph):
    found = visit(node, [])
    if found:
      return found
  return []


def test_import_graph_has_no_cycle_no_program_import_and_no_local_import():
  """The package's modules import each other at module level only, in an acyclic graph, and no
  library module imports a program (a module run with `python -m`, which calls `run_program`)."""
  modules = _modules()
  programs = {name for name, path in modules.items() if "run_program(main" in open(path).read()}
  graph = {}
  for name, path in modules.items():
    top, local = _imports(path, modules)
    assert not local, f"{name} imports {sorted(local)} inside a function: import at module level"
    graph[name] = {n for n in top if n in modules and n != name}
    if name not in programs:
      assert not graph[name] & programs, (
        f"library module {name} imports the program(s) {sorted(graph[name] & programs)}"
      )
  cycle = _first_cycle(graph)
  assert not cycle, f"import cycle: {' -> '.join(cycle)}"
  assert len(programs) >= 7 and "minilm_jax.distill.trainer" in graph


def _node(module: str) -> str:
  """The node of the folder graph a module belongs to: `runs/` for every module of minilm_jax/runs/,
  `train` for a root module, `minilm_jax` for the package's own __init__ (JAX's quiet start)."""
  parts = module.split(".")
  if len(parts) == 1:
    return "minilm_jax"
  return parts[1] + "/" if os.path.isdir(os.path.join(ROOT, "minilm_jax", parts[1])) else parts[1]


def _folder_graph() -> dict:
  """{node: {node it imports: [(importing module, imported module), ...]}} over the package."""
  modules = _modules()
  graph: dict = {_node(name): {} for name in modules}
  for name, path in modules.items():
    for other in _imports(path, modules)[0]:
      if other in modules and _node(other) != _node(name):
        graph[_node(name)].setdefault(_node(other), []).append((name, other))
  return graph


def test_the_folders_import_each_other_in_no_loop():
  """Each sub-package of minilm_jax/ one node, each root module its own: no loop between them (a loop
  between two folders passes the module-level cycle check above and still ties them together)."""
  graph = _folder_graph()
  loop = _first_cycle(graph)
  arrows = [f"{a} -> {b} ({graph[a][b][0][0]} imports {graph[a][b][0][1]})" for a, b in zip(loop, loop[1:])]
  assert not loop, "folders import each other in a loop: " + "; ".join(arrows)


def _documented_layers() -> list:
  """docs/architecture.md's "Layers": its numbered lines, top (the programs) first, each the set of
  nodes named in backticks (folders end in /)."""
  text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
  section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
  lines = [line for line in section.splitlines() if re.match(r"\d+\. ", line)]
  return [set(re.findall(r"`([a-z_]+/?)`", line.split(":", 1)[0])) for line in lines]


def test_the_documented_layers_hold_every_folder_and_every_import_runs_down():
  """The page's layers name every node of the folder graph once, and every import goes to the
  importer's own layer or one below it: the page cannot drift from the code."""
  layers = _documented_layers()
  where = {node: i for i, layer in enumerate(layers) for node in layer}
  named = [node for layer in layers for node in layer]
  graph = _folder_graph()
  assert sorted(named) == sorted(set(named)), "a node is named in two layers"
  assert set(graph) == set(where), (
    f"docs/architecture.md's layers lack {sorted(set(graph) - set(where))} and name "
    f"{sorted(set(where) - set(graph))}, which the package lacks"
  )
  up = [
    f"{a} (layer {where[a] + 1}) imports {b} (layer {where[b] + 1}): {imports[0][0]} imports {imports[0][1]}"
    for a, targets in graph.items()
    for b, imports in targets.items()
    if where[b] < where[a]
  ]
  assert not up, "imports run back up: " + "; ".join(up)


def test_the_readme_map_names_every_folder():
  readme = open(os.path.join(ROOT, "README.md")).read()
  the_map = readme.split("## Map", 1)[1].split("\n## ", 1)[0]
  folders = {node for node in _folder_graph() if node.endswith("/")}
  assert not [f for f in sorted(folders) if f"`{f}`" not in the_map and f"`minilm_jax/{f}`" not in the_map]


def test_the_package_root_holds_programs_and_the_benchmarks_serve_bench_alone():
  """The root holds the programs (`python -m minilm_jax.<program>`) and `errors`, at most 10
  modules; the library lives in named folders. Only `bench` and the suites themselves import
  `benchmarks/`: what another program shares with them (shapes, FLOP counts, timing, tables) lives
  in the library."""
  modules = _modules()
  root = {name for name, path in modules.items() if os.path.dirname(path) == os.path.join(ROOT, "minilm_jax")}
  programs = {name for name, path in modules.items() if "run_program(main" in open(path).read()}
  assert len(root) <= 10 and root - programs == {"minilm_jax", "minilm_jax.errors"}, sorted(root - programs)
  for name, path in modules.items():
    if name.startswith("minilm_jax.benchmarks") or name == "minilm_jax.bench":
      continue
    top, _ = _imports(path, modules)
    assert not [n for n in top if n.startswith("minilm_jax.benchmarks")], f"{name} imports from benchmarks/"


def test_distillation_and_finetuning_import_the_shared_wings_not_each_other():
  """`distill/` (general distillation) and `finetuning/` (whose second stage distils too) share the
  objectives (`transfer/`) and the evaluators (`evaluation/`), and import neither of each other."""
  modules = _modules()
  for name, path in modules.items():
    top, _ = _imports(path, modules)
    for mine, other in (
      ("minilm_jax.distill", "minilm_jax.finetuning"),
      ("minilm_jax.finetuning", "minilm_jax.distill"),
    ):
      if name.startswith(mine + ".") or name == mine:
        assert not [n for n in top if n == other or n.startswith(other + ".")], f"{name} imports {other}"


def test_small_pieces():
  """No function of the package over 80 lines and no package file over 500 (ruff's C901 holds each
  function to a complexity of 12): a piece that outgrows them is split where its parts have names."""
  long_functions, long_files = [], []
  for name, path in sorted(_modules().items()):
    source = open(path).read()
    if source.count("\n") > 500:
      long_files.append(f"{name} ({source.count(chr(10))} lines)")
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 80:
        long_functions.append(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
  assert not long_functions and not long_files, long_functions + long_files


def test_few_wide_signatures():
  """At most 25 functions of the package outside `kernels/` take more than five parameters (ruff's
  PLR0913): a function that reads a run, a measurement or a model's parts takes that object, not
  its fields. The Pallas kernels' bodies are left out: one argument per operand, as `pallas_call`
  passes them."""
  proc = subprocess.run(
    [sys.executable, "-m", "ruff", "check", "--select", "PLR0913", "--output-format", "concise", "minilm_jax"],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  wide = [line for line in proc.stdout.splitlines() if "PLR0913" in line and "minilm_jax/kernels/" not in line]
  assert proc.returncode in (0, 1) and len(wide) <= 25, f"{len(wide)} functions take more than five parameters"


def test_every_package_folder_is_a_package():
  """setup.py's find_packages installs only folders with an __init__.py."""
  folders = {os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "minilm_jax", "**", "*.py"), recursive=True)}
  assert not [f for f in folders if not os.path.exists(os.path.join(f, "__init__.py"))]


@pytest.mark.xdist_group("lint")
def test_xdist_groups_reach_the_scheduler(request):
  """Under the README's command (pytest-xdist, `--dist loadgroup`) a grouped test's id carries its
  group, which is what keeps a group's tests, and the module fixture they share, on one worker. A
  pytest that stores ids where pytest-xdist cannot append the group (9.2 with xdist 3.8) makes every
  group silently void: each worker then builds its own copy of every shared fixture."""
  if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers under loadgroup
    pytest.skip("not under pytest-xdist's loadgroup scheduling")
  assert request.node.nodeid.endswith("@lint"), request.node.nodeid


# The modules that declare kinds, and the only ones that may test a value against one: task heads,
# run records, task students, distillation objectives, task-distillation objectives, evaluators.
REGISTRIES = {
  "minilm_jax/models/heads.py",
  "minilm_jax/runs/record.py",
  "minilm_jax/models/students.py",
  "minilm_jax/transfer/objectives.py",
  "minilm_jax/transfer/logits.py",
  "minilm_jax/evaluation/evaluators.py",
}


# The config fields (and the local names the code reads them into) that choose a variant: each has
# a registry to ask (heads, students, objectives, ETD's `WIDTH_METHODS` and `DEPTH_STRATEGIES`,
# `POOLING_MODES`, `MODEL_TYPES`, task distillation's `OPTIMIZERS`, `ROW_KINDS`, `QG_CONTEXTS`).
VARIANT_FIELDS = {
  *("kind", "method", "strategy", "mode", "model_type", "rows", "context", "qg_context", "target", "optimizer.name")
}


def _field_like(node, fields) -> bool:
  """One of `fields`: `f`, `x.f`, `x["f"]` or `x.get("f")`; with "optimizer.name" among them, an
  optimizer's name (`opt.name`, `optimizer.name`)."""
  if isinstance(node, ast.Name):
    return node.id in fields
  if isinstance(node, ast.Attribute):
    owner = getattr(node.value, "id", getattr(node.value, "attr", ""))
    optimizer = node.attr == "name" and owner in ("opt", "optimizer") and "optimizer.name" in fields
    return node.attr in fields or optimizer
  if isinstance(node, ast.Subscript):
    return isinstance(node.slice, ast.Constant) and node.slice.value in fields
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
    return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in fields
  return False


def _kind_like(node) -> bool:
  return _field_like(node, {"kind"})


def _names_a_variant(node) -> bool:
  """A string literal, or a tuple, list or set of them: the name(s) of a variant."""
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return bool(node.elts) and all(_names_a_variant(e) for e in node.elts)
  return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _is_head(node) -> bool:
  return (isinstance(node, ast.Name) and node.id == "head") or (isinstance(node, ast.Attribute) and node.attr == "head")


def kind_tests(source: str) -> list:
  """Line numbers of the tests of a kind (`kind == ...`, `x.kind in (...)`, `head["kind"] != ...`)
  and of the key-presence tests on a head description (`"labels" in head`, `head.get(...)`)."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Compare):
      operands = [node.left, *node.comparators]
      presence = any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and _is_head(node.comparators[-1])
      variant = any(_field_like(o, VARIANT_FIELDS) for o in operands) and any(_names_a_variant(o) for o in operands)
      if presence or variant or any(_kind_like(o) for o in operands):
        found.append(node.lineno)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
      if _is_head(node.func.value):
        found.append(node.lineno)
  return found


def test_kinds_are_tested_in_their_registries_alone():
  """Heads, run records, students, objectives and every configured variant are registries: code
  elsewhere asks an entry (`head_kind(head).generates`, `record.multi_task`,
  `student_kind(kind).joint`, `config.architecture.positions_after_padding`), it does not compare a
  variant's name (`VARIANT_FIELDS`) nor test which keys a head has."""
  assert kind_tests('if head["kind"] == SEQ2SEQ: pass\nx = record.kind in (A, B)\ny = "labels" in head') == [1, 2, 3]
  assert kind_tests("z = head.get('masked_targets')\nw = kind_of(head).generates") == [1]
  variants = (
    'if etd.method == "rand": pass\nif opt.name == "adam": pass\nx = config.model_type != "bert"\ny = mode in ("cls",)'
  )
  assert kind_tests(variants) == [1, 2, 3, 4]
  offenders = []
  for path in sorted(glob.glob(os.path.join(ROOT, "minilm_jax", "**", "*.py"), recursive=True)):
    name = os.path.relpath(path, ROOT)
    if name not in REGISTRIES:
      offenders += [f"{name}:{line}" for line in kind_tests(open(path).read())]
  assert not offenders, f"kind or head-key tests outside the registries: {offenders}"


_PATH_TOKEN = re.compile(r"`([\w./-]+(?:\.(?:py|sh|sbatch|md)|/))`")


def test_every_file_the_architecture_tables_name_exists_in_its_folder():
  """Each row of docs/architecture.md's tables names files in the folders its first column names
  (or from the repository's root, or the package's: `models/hf.py`): every one of them exists, so
  a move or a rename that forgets the page fails here."""
  text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
  missing = []
  for row in (line for line in text.splitlines() if line.startswith("| `")):
    first, rest = row.split("|")[1], "|".join(row.split("|")[2:])
    folders = {p if p.endswith("/") else os.path.dirname(p) for p in _PATH_TOKEN.findall(first) if "/" in p}
    for token in _PATH_TOKEN.findall(first) + _PATH_TOKEN.findall(rest):
      places = [os.path.join(ROOT, folder, token) for folder in ("", "minilm_jax", *folders)]
      if not any(os.path.exists(place) for place in places):
        missing.append(f"{token} (row {first.strip()})")
  assert not missing, "docs/architecture.md names files that do not exist: " + "; ".join(missing)


_FILES_A_RUN_WRITES = ("json", "jsonl", "lock")
_DOTTED_NAME = re.compile(r"`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?:\.py|/)?`")


def _package_docstrings() -> dict:
  """{package folder: (its modules and sub-packages, the names its docstring gives in backticks)}."""
  out = {}
  for init in glob.glob(os.path.join(ROOT, "minilm_jax", "*", "**", "__init__.py"), recursive=True):
    folder = os.path.dirname(init)
    members = {name[:-3] for name in os.listdir(folder) if name.endswith(".py") and name != "__init__.py"}
    members |= {name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, "__init__.py"))}
    docstring = ast.get_docstring(ast.parse(open(init).read())) or ""
    out[os.path.relpath(folder, ROOT)] = (members, _DOTTED_NAME.findall(docstring), docstring)
  return out


def test_every_subpackage_docstring_names_each_of_its_modules_and_only_modules_that_exist():
  """A sub-package's docstring is its caption: it names every module (and sub-package) it holds, in
  backticks, and a name in backticks is a module of its own folder, another folder of the package
  (`finetuning/`), a module of one (`finetuning.multitask`), or a program (`evaluate`), or an
  attribute of one of those (`attention.flash_attention`): a caption cannot keep a module that moved."""
  package = os.path.join(ROOT, "minilm_jax")
  top = {name[:-3] if name.endswith(".py") else name for name in os.listdir(package) if not name.startswith("_")}
  problems = []
  for folder, (members, names, docstring) in sorted(_package_docstrings().items()):
    if not docstring:
      problems.append(f"{folder} has no docstring")
      continue
    firsts = {name.split(".")[0] for name in names}
    problems += [f"{folder}'s docstring does not name `{m}`" for m in sorted(members - firsts)]
    for name in names:
      head, *tail = name.split(".")
      if tail and tail[-1] in _FILES_A_RUN_WRITES or head == os.path.basename(folder):
        continue  # a file of a workdir (`results.json`, `run.lock`), or the package itself
      if head in members or name in os.listdir(os.path.join(ROOT, folder)):
        continue
      elif head in top and (not tail or os.path.isdir(os.path.join(package, head))):
        inner = os.path.join(package, head)
        if not tail or any(os.path.exists(os.path.join(inner, tail[0] + ext)) for ext in (".py", "")):
          continue
      problems.append(f"{folder}'s docstring names `{name}`, no module of the package")
  assert not problems, "; ".join(problems)
