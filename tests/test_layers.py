"""The package's import structure: layers that only import downwards, and no circle.

  launch/           the launcher, sweeps, searches, their results (over the package)
  commands (main, translate, evaluate, ...)   benchmarks/
  planning/         the fit check, the roofline, the cost model (compile-only)
  training/         the loop, the step, the optimizer, early stopping
  inference/        restoring a run, translating, scoring, the export
  model/   data/    the Transformer and its search; corpora, tokenizers, batches
  kernels/          Pallas kernels (the model's and the step's)
  shared            config, registry, cli, files, stop_policy, checkpoint store, summaries, mesh, ...

Every import counts, those inside functions too (a lazy import still ties two modules).
"""

import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PACKAGES = ("transformer_jax", "launch")
SHARED = {"config", "cli", "files", "checkpoint", "summaries", "partitioning",
          "distributed", "compile_cache", "registry", "stop_policy"}
# A layer -> the layers it may import (its own included).
ALLOWED = {"shared": {"shared"}, "kernels": {"shared", "kernels"}, "data": {"shared", "data"},
           "model": {"shared", "kernels", "model"},
           "inference": {"shared", "data", "kernels", "model", "inference"},
           "training": {"shared", "data", "kernels", "model", "inference", "training"},
           "planning": {"shared", "data", "kernels", "model", "inference", "training",
                        "planning"},
           "benchmarks": {"shared", "data", "kernels", "model", "inference", "training",
                          "planning", "benchmarks"},
           "command": {"shared", "data", "kernels", "model", "inference", "training",
                       "planning", "benchmarks", "command"}}


def _modules() -> dict[str, str]:
  found = {}
  for folder, _, names in [walked for package in PACKAGES
                           for walked in os.walk(os.path.join(ROOT, package))]:
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        found[module.removesuffix(".__init__")] = path
  return found


def _imports(module: str, path: str, modules: dict[str, str]) -> set[str]:
  package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
  out = set()
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      out |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
              for a in node.names}
  return {name for name in out if name in modules and name != module}


def _layer(module: str) -> str:
  parts = module.split(".")
  if parts[0] == "launch":
    return "launch"
  if len(parts) >= 2 and parts[1] in SHARED:  # A module, or the config's package.
    return "shared"
  if len(parts) >= 2 and parts[1] in ALLOWED:  # A folder, or its __init__.
    return parts[1]
  return "command"  # transformer_jax itself and the commands beside the folders.


def test_each_layer_imports_only_the_layers_below_it():
  modules = _modules()
  assert {"transformer_jax.checkpoint", "transformer_jax.training.loop",
          "transformer_jax.inference.restore"} <= set(modules)
  assert {"launch.search", "launch.results"} <= set(modules)
  upward = [f"{m} -> {d}" for m, path in modules.items() if _layer(m) != "launch"
            for d in _imports(m, path, modules) if _layer(d) not in ALLOWED[_layer(m)]]
  assert not upward, upward


def test_no_module_imports_itself_through_others():
  modules = _modules()
  graph = {m: _imports(m, path, modules) for m, path in modules.items()}
  circles, done = [], set()

  def visit(module, path):
    for dep in graph[module]:
      if dep in path:
        circles.append(" -> ".join(path[path.index(dep):] + [dep]))
      elif dep not in done:
        visit(dep, path + [dep])
    done.add(module)

  for module in graph:
    if module not in done:
      visit(module, [module])
  assert not circles, circles


@pytest.mark.parametrize("command", ["translate", "evaluate", "score", "export"])
def test_inference_commands_do_not_import_training(command):
  """Inference sits below training: the commands that read a run import no module of
  transformer_jax.training (no optimizer, no loop); what both need (the checkpoint
  store, the summaries, the losses) lives above it or in the model."""
  assert importlib.util.find_spec("transformer_jax.training.loop")  # The package is real.
  code = (f"import sys, transformer_jax.{command}; print(sorted(m for m in sys.modules "
          "if m.startswith('transformer_jax.training')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "[]"
