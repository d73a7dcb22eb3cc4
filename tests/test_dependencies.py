"""Every third-party module the project imports is a declared dependency, so a fresh
virtualenv that installs `.[test]` has everything (a green CI on a machine with extra
packages once hid an undeclared matplotlib)."""

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib

from conftest import ROOT

SOURCES = ("transformer_jax", "launch", "configs", "tests", "experiments")


def _normalize(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
  project = tomllib.loads((pathlib.Path(ROOT) / "pyproject.toml").read_text())["project"]
  extras = project["optional-dependencies"]
  requirements = project["dependencies"] + extras["test"]
  for own in [r for r in extras["test"] if r.startswith(project["name"] + "[")]:
    for extra in own[own.index("[") + 1:own.index("]")].split(","):  # .[tfds,export]
      requirements += extras[extra]
  return {_normalize(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}


def _imported_modules() -> dict[str, str]:
  """Top-level module name -> a file that imports it (absolute imports only)."""
  found = {}
  for folder in SOURCES:
    for path in sorted(pathlib.Path(ROOT, folder).rglob("*.py")):
      for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          names = [node.module]
        else:
          continue
        for name in names:
          found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
  return found


def undeclared(imported: dict[str, str], declared: set[str]) -> list[str]:
  local = {*SOURCES, "conftest", "__future__"}
  distributions = importlib.metadata.packages_distributions()
  problems = []
  for module, where in sorted(imported.items()):
    if module in sys.stdlib_module_names or module in local:
      continue
    providers = {_normalize(d) for d in distributions.get(module, [])}
    if not providers:
      problems.append(f"{module} (imported by {where}) is not installed")
    elif not providers & declared:
      problems.append(f"{module} (imported by {where}) comes from {sorted(providers)}, "
                      "which pyproject.toml does not declare")
  return problems


def test_every_third_party_import_is_declared_in_pyproject():
  imported = _imported_modules()
  assert {"jax", "flax", "matplotlib", "pytest"} <= set(imported)  # The scan sees them.
  assert undeclared(imported, _declared()) == []


def test_the_check_catches_an_undeclared_import():
  imported = {"matplotlib": "launch/results.py", "jax": "transformer_jax/model/transformer.py"}
  problems = undeclared(imported, _declared() - {"matplotlib"})
  assert len(problems) == 1 and "matplotlib (imported by launch/results.py)" in problems[0]
