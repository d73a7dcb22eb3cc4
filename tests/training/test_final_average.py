"""The final evaluation translates with the mean of the last checkpoints, as the paper's
base (5) and big (20) models (Sec. 6.1): `train.average_last`."""

import json
import os
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from conftest import ROOT, xla_flags


def test_the_final_parameters_are_the_mean_of_the_last_checkpoints(tmp_path):
  """Checkpoints 10 to 50 (every parameter equal to its step) and the final state at
  step 60 in memory (every parameter 60; its checkpoint on disk holds 0, so reading it
  instead would show): average_last=k is the mean of the last k-1 checkpoints before
  60 and the final state; more than were written: all of them; 1: the state alone."""
  import flax.linen as nn
  import orbax.checkpoint as ocp
  from conftest import smoke_config
  from transformer_jax import checkpoint
  from transformer_jax.model.transformer import Transformer, init_params
  from transformer_jax.training import loop
  cfg = smoke_config()
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(Transformer(cfg.model),
                                                            jax.random.key(0))))
  full = lambda value: jax.tree.map(lambda x: jax.numpy.full(x.shape, value, x.dtype), shapes)
  mngr = checkpoint.manager(str(tmp_path), keep=10)
  for step, value in ((10, 10), (20, 20), (30, 30), (40, 40), (50, 50), (60, 0)):
    mngr.save(step, args=ocp.args.StandardSave({"params": full(value), "step": step}))
  mngr.wait_until_finished()
  state = types.SimpleNamespace(step=60, params=full(60))
  for average_last, steps in ((1, [60]), (2, [50, 60]), (3, [40, 50, 60]),
                              (9, [10, 20, 30, 40, 50, 60])):
    params, averaged = loop.final_params(state, str(tmp_path), average_last)
    assert averaged == steps, (average_last, averaged)
    for leaf in jax.tree.leaves(params):
      np.testing.assert_allclose(np.asarray(leaf), np.mean(steps), rtol=1e-6)


@pytest.mark.slow
def test_a_run_reports_the_mean_of_its_last_checkpoints(tmp_path):
  """A 20-step run with a checkpoint every 5 steps, 4 kept and average_last=3: its
  results.json names checkpoints 10, 15 and 20, the printed score says it is their
  mean, and its translations are those of evaluate, whose --average_last is by default
  the run's (fewer if fewer checkpoints are kept up to --step)."""
  workdir = tmp_path / "run"
  env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                        "--config=configs/transformer.py:numbers,smoke", f"--workdir={workdir}",
                        "--config.train.checkpoint_every_steps=5",
                        "--config.train.keep_checkpoints=4", "--config.train.average_last=3"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  results = json.loads((workdir / "results.json").read_text())
  assert (results["averaged"], results["step"]) == ([10, 15, 20], 20)
  assert "; the mean of the last 3 checkpoints): sacreBLEU" in out.stdout
  evaluated = subprocess.run([sys.executable, "-m", "transformer_jax.evaluate",
                              f"--workdir={workdir}", "--split=eval"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert "checkpoints [10, 15, 20]" in evaluated.stdout, evaluated.stdout
  assert (workdir / "translations" / "step_20_avg3.txt").read_text() == \
      (workdir / "translations" / "eval_avg3_step20.txt").read_text()
  # Up to step 10 two checkpoints are kept (5 and 10): the default takes both, as the
  # run's final evaluation would have.
  evaluated = subprocess.run([sys.executable, "-m", "transformer_jax.evaluate",
                              f"--workdir={workdir}", "--split=eval", "--step=10"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert evaluated.returncode == 0, evaluated.stderr[-3000:]
  assert "checkpoints [5, 10]" in evaluated.stdout, evaluated.stdout


@pytest.mark.slow
def test_a_run_with_fewer_checkpoints_or_no_test_split_says_so_once_and_keeps_them(
    tmp_path):
  """train.average_last=5 where a 20-step run writes 2 checkpoints, on data with no test
  split: one warning names average_last and the checkpoints averaged, one line says no
  test split was scored and why; the run ends well with its checkpoints and results."""
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "-m", "transformer_jax.main",
                        "--config=configs/transformer.py:numbers,smoke", f"--workdir={workdir}",
                        "--config.train.checkpoint_every_steps=10",
                        "--config.train.average_last=5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-3000:]
  fewer = [line for line in out.stderr.splitlines() if "fewer than" in line]
  assert len(fewer) == 1 and "2 checkpoint(s) [10, 20]" in fewer[0] \
      and "train.average_last=5" in fewer[0], fewer
  untested = [line for line in out.stderr.splitlines() if "test split" in line]
  assert len(untested) == 1 and "no test split scored: task 'numbers'" in untested[0], \
      untested
  results = json.loads((workdir / "results.json").read_text())
  assert results["averaged"] == [10, 20] and "test" not in results, results
  assert {p.name for p in (workdir / "checkpoints").iterdir()} >= {"10", "20"}
