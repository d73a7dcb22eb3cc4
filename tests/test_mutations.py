"""The deliberate breakages of .ci/mutations.py stay applicable: each one's text is in
its file exactly once, the mutated file still parses, the tests it names exist, and
--only can name it (a reworded line would otherwise turn its mutation into an error
found only when the script runs)."""

import importlib.util
import os
import re

from conftest import ROOT


def test_every_mutation_applies_once_parses_and_names_tests_that_exist():
  spec = importlib.util.spec_from_file_location("mutations",
                                                os.path.join(ROOT, ".ci", "mutations.py"))
  mutations = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mutations)
  assert len(mutations.MUTATIONS) >= 80
  problems = []
  for name, (path, text, replacement, tests) in mutations.MUTATIONS.items():
    if "," in name:  # --only=NAME,... splits on commas.
      problems.append(f"{name}: a comma in its name")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      source = f.read()
    if source.count(text) != 1 or text == replacement:
      problems.append(f"{name}: its text is in {path} {source.count(text)} times")
    elif path.endswith(".py"):
      try:
        compile(source.replace(text, replacement), path, "exec")
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
