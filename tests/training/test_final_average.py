"""The final evaluation translates with the mean of the last checkpoints' parameters, as
the paper's base (5) and big (20) models (Sec. 6.1): `train.average_last`, summed on the
devices at the snapshot steps (training/averaging.py), through preemptions, resumes and
a full disk."""

import json
import os
import re
import signal
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from conftest import (COMPARABLE_RUNS, ROOT, ROUNDING_CONTROL, assert_within_rounding,
                      checkpoint_state, max_relative_difference, xla_flags)


def _trajectory(cfg, steps):
  """Parameters of the smoke model at each step: x0 + step * dx, x0 and dx random."""
  import flax.linen as nn
  from transformer_jax.model.transformer import Transformer, init_params
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(Transformer(cfg.model),
                                                            jax.random.key(0))))
  rng = np.random.default_rng(0)
  x0, dx = (jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)
            for _ in range(2))
  return {step: jax.tree.map(lambda a, b: jax.numpy.asarray(a + np.float32(step / 7) * b),
                             x0, dx) for step in steps}


def _mean64(trees):
  return jax.tree.map(lambda *xs: np.mean(np.asarray(xs, np.float64), axis=0), *trees)


def test_the_snapshots_are_the_last_step_and_the_cadence_before_it():
  """train.average_last snapshots, train.checkpoint_every_steps apart: the last step
  and the cadence's steps before it, latest first, all of them in a shorter run; big's
  are its last 20 checkpoints, 600 steps apart (Sec. 6.1)."""
  from transformer_jax.training import averaging
  for last in range(1, 50):
    for every in range(1, 12):
      for count in range(1, 7):
        steps = averaging.snapshot_steps(last, every, count)
        assert steps[-1] == last and len(steps) == min(count, 1 + (last - 1) // every)
        assert all(s % every == 0 for s in steps[:-1]), steps
        assert all(b - a == every for a, b in zip(steps[:-2], steps[1:-1])), steps
        assert 0 < last - steps[-2] <= every if len(steps) > 1 else True, steps
  assert averaging.snapshot_steps(300_000, 600, 20) == tuple(range(288_600, 300_001, 600))


def test_the_average_is_the_mean_of_the_snapshots_within_rounding(tmp_path):
  """The window sums the parameters at the snapshot steps of 17 steps (every 3, the last
  4: 9, 12, 15, 17) and the final evaluation divides: the float64 mean of those four
  within rounding (control: the same mean with every parameter one float32 ulp up), and
  the same bits as `evaluate --average_last` averaging them from checkpoints. A run that
  ends early (its sum incomplete) averages the snapshots before its step found on disk."""
  import orbax.checkpoint as ocp
  from conftest import smoke_config
  from transformer_jax import checkpoint
  from transformer_jax.inference import restore
  from transformer_jax.training import averaging
  cfg = smoke_config(train={"num_train_steps": 17, "checkpoint_every_steps": 3,
                            "average_last": 4}).train
  params = _trajectory(smoke_config(), range(1, 18))
  def final_at(last):  # The loop's window over steps 1..last, and its final parameters.
    window = averaging.Window.of(cfg)
    for step in range(1, last + 1):
      window.add(step, params[step])
    state = types.SimpleNamespace(step=last, params=params[last])
    return averaging.final_params(state, window, str(tmp_path), cfg)

  mean, averaged = final_at(17)
  assert averaged == [9, 12, 15, 17]
  exact = _mean64([params[s] for s in averaged])
  up = lambda tree: jax.tree.map(lambda x: np.nextafter(x, np.float32(np.inf)), tree)
  assert_within_rounding({"mean": max_relative_difference(mean, exact)},
                         {"mean": max_relative_difference(
                             _mean64([up(params[s]) for s in averaged]), exact)})
  from_checkpoints = restore.mean(params[s] for s in averaged)
  jax.tree.map(np.testing.assert_array_equal, mean, from_checkpoints)
  # Stopped early at 14: its window holds 9 and 12 only; the disk has 6, 9, 12 and 13.
  mngr = checkpoint.manager(str(tmp_path), keep=10)
  for step in (6, 9, 12, 13):
    mngr.save(step, args=ocp.args.StandardSave({"params": params[step], "step": step}))
  mngr.wait_until_finished()
  mean, averaged = final_at(14)
  assert averaged == [6, 9, 12, 14]
  jax.tree.map(np.testing.assert_array_equal, mean,
               restore.mean(params[s] for s in averaged))


@pytest.mark.parametrize("forced_at, defer", [(13, True), (15, False)])
def test_a_forced_checkpoint_in_the_window_is_no_snapshot_and_resuming_averages_the_same(
    tmp_path, forced_at, defer):
  """The loop's checkpoint path (saving.Saver, averaging.Window, Orbax): a run stopped
  inside the window with a forced checkpoint (at 13, between snapshots; at 15, one of
  them) and resumed from it averages the snapshots 9, 12, 15 and 17 exactly as the run
  that was not stopped: the forced step is not among them, and the sum comes back with
  the checkpoint; with checkpoints deferred (saved in the saver's thread) or not."""
  from conftest import smoke_config
  from transformer_jax import checkpoint, partitioning
  from transformer_jax.training import averaging, run as run_lib, saving
  cfg = smoke_config(train={"num_train_steps": 17, "checkpoint_every_steps": 3,
                            "average_last": 4, "keep_checkpoints": 2,
                            "defer_checkpoints": defer})
  mesh = partitioning.make_mesh((1, 1, 1), jax.devices()[:1])
  _, abstract = run_lib.make_run(cfg, mesh, abstract=True)
  params = _trajectory(cfg, range(1, 18))
  def state_at(step):  # Adam's moments at 0: only the parameters are averaged.
    zeros = jax.tree.map(lambda a: jax.device_put(np.zeros(a.shape, a.dtype), a.sharding),
                         abstract)
    return zeros.replace(step=jax.device_put(np.int32(step), abstract.step.sharding),
                         params=jax.tree.map(lambda p, a: jax.device_put(p, a.sharding),
                                             params[step], abstract.params))

  def train(workdir, steps, window, stop_at=None):
    saver = saving.Saver(checkpoint.manager(workdir, 2), workdir, cfg.train, window)
    for step in steps:
      state = state_at(step)
      window.add(step, state.params)
      if step == stop_at:
        saver.save(step, state, force=True)
        saver.wait()
        return
      saver.after_step(step, state)
    saver.wait()
    return averaging.final_params(state, window, workdir, cfg.train)

  whole, whole_steps = train(str(tmp_path / "whole"), range(1, 18), averaging.Window.of(
      cfg.train))
  stopped = str(tmp_path / "stopped")
  train(stopped, range(1, 18), averaging.Window.of(cfg.train), stop_at=forced_at)
  restored = checkpoint.restore_state(checkpoint.manager(stopped, 2), abstract)
  assert int(restored.step) == forced_at
  state, window = averaging.Window.resume(cfg.train, restored)
  assert window.summed == [s for s in (9, 12, 15) if s <= forced_at]
  resumed, resumed_steps = train(stopped, range(forced_at + 1, 18), window)
  assert whole_steps == resumed_steps == [9, 12, 15, 17]
  jax.tree.map(np.testing.assert_array_equal, whole, resumed)


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


# 200 smoke steps, a checkpoint every 20, the last 3 averaged: snapshots 160, 180, 200.
WINDOW_RUN = ["--config=configs/transformer.py:numbers,smoke",
              "--config.train.num_train_steps=200", "--config.train.checkpoint_every_steps=20",
              "--config.train.average_last=3", "--config.train.log_every_steps=10",
              "--config.train.eval_every_steps=200", "--config.train.final_test=False",
              *COMPARABLE_RUNS]
SNAPSHOTS = [160, 180, 200]


def _main(workdir, *flags, wait=True):
  env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"}
  command = [sys.executable, "-m", "transformer_jax.main", f"--workdir={workdir}",
             *WINDOW_RUN, *flags]
  if not wait:
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
  return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600)


def _average(workdir):
  """The run's final average, from its last checkpoint's running sum."""
  saved = checkpoint_state(str(workdir), 200)
  assert [int(s) for s in saved["average_steps"]] == SNAPSHOTS
  return jax.tree.map(lambda x: np.asarray(x) / 3, saved["average_sum"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The run not stopped (all its checkpoints kept), its average, and the control: the
  same run with every initial parameter one float32 ulp up."""
  workdir = tmp_path_factory.mktemp("whole") / "run"
  done = _main(workdir, "--config.train.keep_checkpoints=20")
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads((workdir / "results.json").read_text())["averaged"] == SNAPSHOTS
  control = tmp_path_factory.mktemp("control") / "run"
  nudged = _main(control, ROUNDING_CONTROL)
  assert nudged.returncode == 0, nudged.stderr[-3000:]
  average = _average(workdir)
  return workdir, average, max_relative_difference(_average(control), average)


@pytest.mark.slow
def test_a_run_preempted_in_the_window_averages_what_an_uninterrupted_run_does(
    tmp_path, uninterrupted):
  """SIGTERM once the log shows step 160: the run checkpoints the step it is at (inside
  the window) and stops; the same command resumes it. Its results name the snapshots
  160, 180 and 200, not the forced step, and its average is the uninterrupted run's
  within rounding."""
  workdir = tmp_path / "run"
  proc = _main(workdir, wait=False)
  lines = []
  for line in proc.stdout:
    lines.append(line)
    if "step 160 of 200" in line:
      proc.send_signal(signal.SIGTERM)
      break
  out = "".join(lines) + proc.communicate(timeout=300)[0]
  assert proc.returncode == 75, out[-3000:]
  stopped = int(out.split("checkpointed step ")[1].split(";")[0])
  assert 160 < stopped < 200, stopped
  resumed = _main(workdir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f"resumed from checkpoint at step {stopped}" in resumed.stderr
  assert json.loads((workdir / "results.json").read_text())["averaged"] == SNAPSHOTS
  _, average, control = uninterrupted
  assert_within_rounding({"average": max_relative_difference(_average(workdir), average)},
                         {"average": control})


@pytest.mark.slow
def test_a_store_that_fills_up_in_the_window_stops_in_one_line_and_loses_no_snapshot(
    tmp_path, uninterrupted):
  """The checkpoints on a tmpfs (a mount namespace of its own) sized from the
  uninterrupted run's checkpoints so that the window's larger ones (with the running
  sum) stop fitting: one error line names the step (in the window), the store and the
  last good checkpoint; after the tmpfs grows, the same command resumes from it and
  averages what the uninterrupted run does."""
  whole, average, control = uninterrupted
  size = lambda step: sum(f.stat().st_blocks * 512 for f in (whole / "checkpoints" /
                                                             str(step)).rglob("*"))
  before, within = size(140), size(160)  # Without the sum, and with it.
  # Two checkpoints and room to write a third (Orbax deletes the oldest after): 3 before
  # the window, and two of the larger ones from 180 on.
  room = (3.05 * before + before + 2.05 * within) / 2 / 1024
  run, store = tmp_path / "run", tmp_path / "run" / "checkpoints"
  command = " ".join([sys.executable, "-m", "transformer_jax.main", f"--workdir={run}",
                      *WINDOW_RUN])
  script = (f"mkdir -p {store} && mount -t tmpfs -o size={room:.0f}k tmpfs {store} && "
            f"cd {ROOT} && {{ {command} > {tmp_path}/first.log 2>&1; "
            f"echo $? > {tmp_path}/first.code; }}; mount -o remount,size=64m {store} && "
            f"{command} > {tmp_path}/second.log 2>&1; echo $? > {tmp_path}/second.code; "
            f"mkdir {tmp_path}/kept && cp -r {store} {tmp_path}/kept/")
  unshare = ["unshare", "--mount"] + ["--map-root-user"] * (os.geteuid() != 0)
  subprocess.run([*unshare, "bash", "-c", script], timeout=900,
                 env={**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu"})
  first = (tmp_path / "first.log").read_text()
  assert (tmp_path / "first.code").read_text().strip() == "74", first[-3000:]
  [error] = [line for line in first.splitlines()  # Not a log line, nor the data's.
             if not re.match(r"[IWE]\d{4} ", line) and not line.startswith("data: ")]
  failed = int(error.split("to save step ")[1].split()[0].rstrip(";"))
  good = int(error.split("the last good checkpoint is step ")[1].split()[0])
  assert error.startswith("error: no space left on the device of ") and \
      good < failed and SNAPSHOTS[0] <= failed <= 200, error
  assert "Traceback" not in first
  second = (tmp_path / "second.log").read_text()
  assert (tmp_path / "second.code").read_text().strip() == "0", second[-3000:]
  assert f"resumed from checkpoint at step {good}" in second
  assert json.loads((run / "results.json").read_text())["averaged"] == SNAPSHOTS
  assert_within_rounding({"average": max_relative_difference(_average(tmp_path / "kept"),
                                                            average)},
                         {"average": control})
