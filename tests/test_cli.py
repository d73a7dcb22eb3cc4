"""Every command defines its flags one way: in `define_flags()`, called by its
`if __name__ == "__main__":` block before `cli.run(main)`; none on import, so any
commands can be imported together (a test, a notebook) without a DuplicateFlagError."""

import ast
import os
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

COMMANDS = ["transformer_jax.main", "transformer_jax.translate", "transformer_jax.evaluate",
            "transformer_jax.score", "transformer_jax.export", "transformer_jax.benchmark",
            "transformer_jax.benchmarks.suite", "transformer_jax.benchmarks.input_pipeline",
            "transformer_jax.benchmarks.lookup_gradient",
            "transformer_jax.benchmarks.kernel_check",
            "transformer_jax.inference.huggingface_parity", "transformer_jax.import_model",
            "launch.__main__", "launch.results", "launch.bundle"]


# Ctrl-C and SIGTERM end these with one line saying what was kept, exit 75
# (tests/scenarios/test_stops.py).
STOPPABLE = {"transformer_jax.main", "transformer_jax.translate", "transformer_jax.evaluate",
             "transformer_jax.score", "transformer_jax.export", "transformer_jax.import_model"}


def _path(module: str) -> str:
  return os.path.join(ROOT, *module.split(".")) + ".py"


def test_commands_define_no_flags_on_import_and_import_together():
  script = ("from absl import flags\nimport importlib, sys\n"
            "for m in sys.argv[1:]: importlib.import_module(m)\n"
            "print(sorted(f'{m}: {f.name}' for m, fs in flags.FLAGS.flags_by_module_dict()"
            ".items() for f in fs if m.startswith(('transformer_jax', 'launch'))\n"
            "       and m != 'transformer_jax.cli'))")
  out = subprocess.run([sys.executable, "-c", script, *COMMANDS], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "[]"  # No flag of ours defined by importing a command.


def test_every_command_runs_define_flags_then_cli_run():
  for module in COMMANDS:
    tree = ast.parse(open(_path(module), encoding="utf-8").read())
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(mains) == 1, module
    calls = [ast.unparse(s) for s in mains[0].body]
    stoppable = "cli.run(main, stopped=" if module in STOPPABLE else "cli.run(main)"
    assert calls[0] == "define_flags()" and len(calls) == 2, (module, calls)
    assert calls[1].startswith(stoppable), (module, calls)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "define_flags"
               or isinstance(n, ast.ImportFrom) and any(a.name == "define_flags"
                                                         for a in n.names)
               for n in tree.body), module


def test_what_main_returns_is_the_exit_code():
  for returned, code in (("3", 3), ("None", 0)):
    out = subprocess.run([sys.executable, "-c", "from transformer_jax import cli; "
                          f"cli.run(lambda: {returned})"], cwd=ROOT, capture_output=True,
                         timeout=120)
    assert out.returncode == code, out.stderr[-2000:]


STOP_BECOMES_ERROR = """
import signal, sys
from transformer_jax import cli
def library():  # Catches the stop and raises its own error, as pybind11 or JAX may.
  try:
    signal.raise_signal(signal.{signal})
  except KeyboardInterrupt:
    raise ValueError("Exception raised while checking equality of metadata fields")
def main():
  {body}
cli.run(main, stopped="before anything was written.")
"""


@pytest.mark.parametrize("signal_name,said", [("SIGINT", "SIGINT (Ctrl-C)"),
                                              ("SIGTERM", "SIGTERM")])
@pytest.mark.parametrize("body", [
    "try:\n    library()\n  except ValueError as e:\n    cli.fail(str(e))",  # Caught.
    "library()"])  # Let through.
def test_a_stop_a_library_turns_into_its_own_error_still_ends_as_a_stop(
    signal_name, said, body):
  """A signal raised inside a library that reports it as an error of its own (seen: an
  ImportError from pybind11, a ValueError from JAX's pytrees): the command's one line
  is the stop's and its exit code 75, whether the command caught the error or not."""
  code = STOP_BECOMES_ERROR.replace("{signal}", signal_name).replace("{body}", body)
  # A shell's background job starts with SIGINT ignored, and cli.run keeps it so.
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  assert out.returncode == 75, out.stderr[-2000:]
  assert out.stderr.strip() == f"stopped by {said} before anything was written."
