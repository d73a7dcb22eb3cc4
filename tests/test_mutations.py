"""The deliberate breakages of .ci/mutations.py stay applicable: each one's text is
inside its scope (a function, class or assignment; a Markdown heading) exactly once,
the mutated file still parses, the tests it names exist, and --only can name it (a
reworded line would otherwise turn its mutation into an error found only when the
script runs); and a mutation aims at its scope alone, wherever the rest of the code
moves."""

import importlib.util
import os
import re

import pytest

from conftest import ROOT


def load_mutations():
  spec = importlib.util.spec_from_file_location("mutations",
                                                os.path.join(ROOT, ".ci", "mutations.py"))
  mutations = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mutations)
  return mutations


def test_every_mutation_applies_once_parses_and_names_tests_that_exist():
  mutations = load_mutations()
  assert len(mutations.MUTATIONS) >= 80
  problems = []
  for name, (path, scope, text, replacement, tests) in mutations.MUTATIONS.items():
    if "," in name:  # --only=NAME,... splits on commas.
      problems.append(f"{name}: a comma in its name")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      source = f.read()
    try:
      mutated = mutations.mutate(source, path, scope, text, replacement)
    except LookupError as e:
      problems.append(f"{name}: {e}")
      continue
    if text == replacement:
      problems.append(f"{name}: its replacement is its text")
    elif path.endswith(".py"):
      try:
        compile(mutated, path, "exec")
      except SyntaxError as e:
        problems.append(f"{name}: {path} no longer parses once mutated ({e.msg}, "
                        f"line {e.lineno})")
    for test in tests.split():
      file, _, function = test.partition("::")
      with open(os.path.join(ROOT, file), encoding="utf-8") as f:
        if function and not re.search(rf"^def {re.escape(function.split('[')[0])}\(",
                                      f.read(), re.M):
          problems.append(f"{name}: no test {test}")
  assert not problems, problems


def test_a_mutation_aims_at_its_scope_wherever_code_moves():
  mutate = load_mutations().mutate
  source = ("X = 1\n\nclass Reporter:\n  @staticmethod\n  def end(tries):\n"
            "    return tries <= 2\n\n\ndef other(tries):\n  return tries <= 2\n")
  mutated = mutate(source, "m.py", "Reporter.end", "tries <= 2", "tries < 2")
  assert mutated == source.replace("    return tries <= 2", "    return tries < 2")
  # Code added or moved around the scope changes nothing; the text elsewhere is not hit.
  moved = "def added():\n  pass\n\n" + source.replace("X = 1\n", "")
  assert mutate(moved, "m.py", "Reporter.end", "tries <= 2", "tries < 2") == (
      moved.replace("    return tries <= 2", "    return tries < 2"))
  assert mutate(source, "m.py", "X", "X = 1", "X = 2").startswith("X = 2\n")
  # The scope moved away, or its text gone from it: an error, never another place hit.
  for scope, text in (("Reporter.begin", "tries <= 2"), ("Reporter.end", "tries < 9"),
                      ("end", "tries <= 2")):
    with pytest.raises(LookupError):
      mutate(source, "m.py", scope, text, "x")
  doc = "# Title\n\n## One\nkeep x\n\n## Two\nkeep x\n"
  assert mutate(doc, "d.md", "## Two", "keep x", "drop x") == doc[:-7] + "drop x\n"
