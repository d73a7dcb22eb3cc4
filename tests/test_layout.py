"""The project's rooms are named for what they hold, and what its prose names exists.

No two modules of transformer_jax/ and launch/ share a file name (`__init__` and
`__main__` aside), so a module's file name alone says which one is meant, in the code
and in prose. And every reference into the project that the prose makes resolves: the
docstrings and comments of the Python files (transformer_jax/, launch/, configs/,
experiments/, tests/), docs/*.md and README.md. A reference is, precisely:

- a path `A/.../NAME.py` whose first folder is a top folder of the repository
  (transformer_jax, launch, configs, experiments, tests, docs), a package of
  transformer_jax (model, training, ...) or a folder of tests/ (as docs/paper.md names
  its tests): the file exists under the repository's root, transformer_jax/ or tests/;
- a dotted name that starts with `transformer_jax.` or `launch.`: modules, then a
  top-level name of the last (function, class, variable, import), then for a class
  one of its methods or attributes (class-level, or `self.x` set in a method); deeper
  parts are not checked;
- a dotted name `FILE.name...` whose first part is the file name of a module of
  transformer_jax/ or launch/ (not a package; unique, by the first test): the same,
  from that module (`checkpoint.restore_state`, `saving.Saver.after_step`);
- a config field `SECTION.field` (SECTION one of Config's sections: data, model, train,
  decode, optimizer): a field of that section's dataclass, or, where the section's name
  is also code's (the data and model packages, training/optimizer.py), a name in it.

Not references: a name right after a word character, `.`, `/`, `$` or `-`, or right
before a word character, `/`, `-` or `=` (part of a longer name, a path or a flag); `NAME.EXT` for a
file's extension (results.json, tokenizer.model); names with a placeholder part
(experiments/NAME.py, data.SPLIT_files); the code in fenced blocks of Markdown and
docstring lines indented beyond their text with a call or assignment (examples).
Everything is read from the code (ast), nothing imported.
"""

import ast
import collections
import dataclasses
import glob
import os
import re
import tokenize

from conftest import ROOT

PACKAGES = ("transformer_jax", "launch")
TOP_FOLDERS = ("transformer_jax", "launch", "configs", "experiments", "tests", "docs")
TEST_FOLDERS = tuple(n for n in os.listdir(os.path.join(ROOT, "tests"))
                     if os.path.isdir(os.path.join(ROOT, "tests", n)))
SECTIONS = ("data", "model", "train", "decode", "optimizer")
# What follows a dot in a file's name, not an attribute's.
EXTENSIONS = {"py", "md", "json", "jsonl", "txt", "model", "vocab", "yaml", "toml", "sh",
              "gz", "csv", "npz", "html", "lock", "log", "tmp", "tsv", "sgm", "cfg", "bin", "perl",
              "safetensors", "de", "en", "fr", "cs", "ini", "zip", "tar", "xz", "pt"}


def _modules() -> dict[str, str]:
  """{dotted module name: file} for every module and package of PACKAGES."""
  found = {}
  for package in PACKAGES:
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
      rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
      found[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
  return found


MODULES = _modules()


def test_no_two_modules_share_a_file_name():
  """A module's file name is unique over transformer_jax/ and launch/ (`__init__` and
  `__main__` aside): `search.py` cannot mean beam search here and Optuna there."""
  by_name = collections.defaultdict(list)
  for name, path in MODULES.items():
    if not path.endswith(("__init__.py", "__main__.py")):
      by_name[os.path.basename(path)].append(os.path.relpath(path, ROOT))
  assert {n: p for n, p in by_name.items() if len(p) > 1} == {}


@dataclasses.dataclass
class _Names:
  """The names a module defines at its top level, and each class's."""
  top: set
  classes: dict


_PARSED: dict[str, _Names] = {}


def _names(module: str) -> _Names:
  if module not in _PARSED:
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    top, classes = set(), {}
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        top.add(node.name)
        if isinstance(node, ast.ClassDef):
          classes[node.name] = {n.name for n in ast.walk(node) if isinstance(
              n, (ast.FunctionDef, ast.AsyncFunctionDef))} | {
              t.id for n in node.body if isinstance(n, (ast.AnnAssign, ast.Assign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Name)} | {  # And `self.x = ...` in its methods.
              n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and
              isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) and
              n.value.id == "self"}
      elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        top |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
      elif isinstance(node, (ast.Import, ast.ImportFrom)):
        top |= {(a.asname or a.name).split(".")[0] for a in node.names}
      elif isinstance(node, (ast.If, ast.Try)):  # try: import x / except ImportError.
        top |= {(a.asname or a.name).split(".")[0] for n in ast.walk(node)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    _PARSED[module] = _Names(top, classes)
  return _PARSED[module]


def _resolves(module: str, attrs: list[str]) -> bool:
  """Whether module's attribute chain `attrs` exists: submodules, then a top-level
  name, then (for a class) one of its methods or fields; deeper parts are unchecked."""
  while attrs and f"{module}.{attrs[0]}" in MODULES:
    module, attrs = f"{module}.{attrs[0]}", attrs[1:]
  if not attrs:
    return True
  names = _names(module)
  if attrs[0] not in names.top:
    return False
  return len(attrs) == 1 or attrs[0] not in names.classes or \
      attrs[1] in names.classes[attrs[0]]


def _section_fields() -> dict[str, set]:
  """{section: its fields}, read from the Config dataclasses' source."""
  sections = {}
  classes = {}
  for module in ("transformer_jax.config", "transformer_jax.config.sections"):
    tree = ast.parse(open(MODULES[module], encoding="utf-8").read())
    for node in tree.body:
      if isinstance(node, ast.ClassDef):
        classes[node.name] = {n.target.id for n in node.body
                              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
  tree = ast.parse(open(MODULES["transformer_jax.config"], encoding="utf-8").read())
  config = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
  for node in config.body:
    if isinstance(node, ast.AnnAssign) and node.target.id in SECTIONS:
      sections[node.target.id] = classes[node.annotation.id]
  return sections


def _prose(path: str) -> str:
  """The docstrings and comments of a Python file; a Markdown file outside its fenced
  blocks. A docstring's line indented beyond its text with a call or an assignment in
  it is an example's code, as a fenced block is: not prose."""
  text = open(path, encoding="utf-8").read()
  if not path.endswith(".py"):
    return re.sub(r"```.*?```", "", text, flags=re.S)
  docstrings = [ast.get_docstring(node) or "" for node in ast.walk(ast.parse(text))
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                     ast.AsyncFunctionDef))]
  parts = [line for doc in docstrings for line in doc.splitlines()
           if not (line.startswith(" ") and EXAMPLE.search(line))]
  with tokenize.open(path) as f:
    parts += [t.string for t in tokenize.generate_tokens(f.readline)
              if t.type == tokenize.COMMENT]
  return "\n".join(parts)


def _prose_files() -> list[str]:
  found = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md"))]
  for folder in ("transformer_jax", "launch", "configs", "experiments", "tests"):
    found += glob.glob(os.path.join(ROOT, folder, "**", "*.py"), recursive=True)
  return sorted(found)


# A call or an assignment: a line of code.
EXAMPLE = re.compile(r"\w\(| = ")
# Words that stand for a name in prose (experiments/NAME.py, data.SPLIT_files).
PLACEHOLDER = re.compile(r"^(NAME|X|SPLIT|PATH|N|K)(_|$)")
PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w-]+\.py)\b")
DOTTED = re.compile(r"(?<![\w./$-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?![\w/=-])")


def stale_references() -> list[str]:
  """'FILE: REFERENCE' for each reference in the prose that names nothing."""
  subpackages = {m.split(".")[1] for m in MODULES if m.count(".") == 1 and
                 MODULES[m].endswith("__init__.py") and m.startswith("transformer_jax.")}
  by_file_name = {m.rsplit(".", 1)[-1]: m for m in MODULES if not MODULES[m].endswith(
      ("__init__.py", "__main__.py"))}
  packages = {m.rsplit(".", 1)[-1]: m for m in MODULES if MODULES[m].endswith("__init__.py")}
  fields = _section_fields()
  stale = []
  for path in _prose_files():
    text, where = _prose(path), os.path.relpath(path, ROOT)
    for ref in PATH.findall(text):
      first = ref.split("/")[0]
      if any(PLACEHOLDER.match(part) for part in re.split(r"[/.]", ref)):
        continue
      if first in TOP_FOLDERS or first in subpackages or first in TEST_FOLDERS:
        if not any(os.path.exists(os.path.join(ROOT, base, ref))
                   for base in ("", "transformer_jax", "tests")):
          stale.append(f"{where}: {ref}")
    for ref in DOTTED.findall(text):
      parts = ref.split(".")
      if parts[-1] in EXTENSIONS or any(PLACEHOLDER.match(part) for part in parts):
        continue
      if parts[0] in PACKAGES:
        module = parts[0]
        ok = _resolves(module, parts[1:])
      elif parts[0] in SECTIONS:
        code = by_file_name.get(parts[0]) or packages.get(parts[0])
        ok = parts[1] in fields[parts[0]] or (code is not None and _resolves(code, parts[1:2]))
      elif parts[0] in by_file_name:
        ok = _resolves(by_file_name[parts[0]], parts[1:])
      else:
        continue
      if not ok:
        stale.append(f"{where}: {ref}")
  return stale


def test_every_reference_in_the_prose_names_what_exists():
  """Each path, dotted name and config field that the docstrings, comments and docs
  name (the rules above) is a file, a module, a name in it, or a field of its section."""
  assert stale_references() == []


def _project_imports(module: str) -> set[str]:
  """The modules of PACKAGES that `module` imports, function-local imports included
  (`from P import m` counts module P.m where it is one, else P)."""
  found = set()
  for node in ast.walk(ast.parse(open(MODULES[module], encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.split(".")[0] in PACKAGES}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
        node.module.split(".")[0] in PACKAGES:
      found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                else node.module for a in node.names}
  return found


def test_the_training_loop_reads_as_its_phases():
  """training/loop.py imports at most 15 of the project's modules: what the loop does
  beside its phases lives in the modules it belongs to (run, evaluation, saving, ...).
  And no module of training/ is under 30 lines with one user alone: fold it into it."""
  imported = _project_imports("transformer_jax.training.loop")
  assert len(imported) <= 15, sorted(imported)
  small = {}
  for module, path in MODULES.items():
    if module.startswith("transformer_jax.training.") and \
        len(open(path, encoding="utf-8").read().splitlines()) < 30:
      users = {m for m in MODULES if m != module and module in _project_imports(m)}
      if len(users) < 2:
        small[module] = sorted(users)
  assert small == {}


def test_the_benchmarks_stay_a_small_room():
  """benchmarks/ holds commands that print speed and memory figures, at most 2,200 lines:
  the fit check, the roofline and the cost model are planning/, and what the benchmarks
  share (timing, flags, reports) is written once."""
  lines = sum(len(open(path, encoding="utf-8").read().splitlines()) for path in glob.glob(
      os.path.join(ROOT, "transformer_jax", "benchmarks", "*.py")))
  assert lines <= 2200, lines
