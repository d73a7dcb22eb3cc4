"""benchmarks/kernel_check.py, the first thing a lent GPU runs: each Pallas kernel's error
from float64 truth beside XLA's path, and its time. Here, interpreted at small sizes."""

import json
import os
import subprocess
import sys

import numpy as np

from conftest import ROOT, ROUNDING_K
from transformer_jax.benchmarks import kernel_check


def test_a_nan_or_an_infinity_is_an_infinite_error_not_a_small_one():
  """A kernel that writes NaN must not pass: NaN compares false with every bound, and
  max() skips it (the H200 loan's wrong residual norm printed a small ratio so)."""
  truth = np.array([1.0, -2.0, 3.0])
  assert np.isclose(kernel_check.relative_difference(truth * (1 + 1e-3), truth), 1e-3)
  for bad in (np.nan, np.inf, -np.inf):
    assert kernel_check.relative_difference(truth + [0, bad, 0], truth) == float("inf")


def test_each_kernel_and_dtype_gets_a_row_with_errors_and_times(tmp_path):
  """Each kernel in bfloat16 and float32, each with XLA's and Pallas's errors for every
  output and gradient and a time; interpreted, both paths are within rounding of each
  other's error; --loss_tiles adds a timed row in bfloat16 alone."""
  out = tmp_path / "check.json"
  run = subprocess.run(
      [sys.executable, "-m", "transformer_jax.benchmarks.kernel_check", "--tokens=150",
       "--d_model=40", "--d_ff=72", "--vocab=200", f"--out={out}", "--loss_tiles=rows=16,vocab=32"],
      cwd=ROOT, env={**os.environ}, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  report = json.loads(out.read_text())
  assert set(report["cases"]) == {f"{kernel} {dtype}" for kernel in ("loss", "norm", "ffn")
                                  for dtype in ("bfloat16", "float32")}
  outputs = {"loss": {"mix", "d_states", "d_embedding"},
             "norm": {"y", "dx", "ds", "dscale", "dbias"}, "ffn": {"y", "dz", "dbias", "dw"}}
  tiles = "pallas rows=16,vocab=32"
  assert [tiles in row for row in report["cases"].values()] == [True] + [False] * 5
  for name, row in report["cases"].items():
    for path in ("xla", "pallas", tiles)[:3 if tiles in row else 2]:
      assert set(row[path]) == outputs[name.split()[0]] | {"ms"}, (name, path)
      assert row[path]["ms"] > 0
    for key in outputs[name.split()[0]]:
      for path in ("pallas", tiles)[:2 if tiles in row else 1]:
        assert row[path][key] <= ROUNDING_K * max(row["xla"][key], 1e-7), (name, path, key)
  for dtype in ("bfloat16", "float32"):  # train.loss_kernel="hybrid"'s path too.
    hybrid, xla = (report["cases"][f"loss {dtype}"][path] for path in ("hybrid", "xla"))
    assert set(hybrid) == outputs["loss"] | {"ms"} and hybrid["ms"] > 0
    assert all(hybrid[k] <= ROUNDING_K * max(xla[k], 1e-7) for k in outputs["loss"]), hybrid
  assert len([line for line in run.stdout.splitlines() if "error / XLA's" in line]) == 6


def test_a_tile_set_that_is_not_tiles_is_refused_in_one_line():
  """--loss_tiles names Tiles fields, each a power of two (num_stages any count)."""
  for text, bad in (("rows=128,bogus=4", "bogus=4"), ("rows=96", "rows=96"),
                    ("vocab=0", "vocab=0"), ("depth", "depth=")):
    run = subprocess.run(
        [sys.executable, "-m", "transformer_jax.benchmarks.kernel_check",
         f"--loss_tiles={text}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --loss_tiles={text}: {bad} is not a Tiles field set to a "
                      "power of two (num_stages: any count); fields: rows, vocab, "
                      "grad_w_vocab, grad_w_rows, grad_h_rows, depth, num_warps, "
                      "num_stages"], run.stderr[-2000:]
