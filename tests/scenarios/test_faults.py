"""Runs that survive: the real entry point, as subprocesses, stopped by
SIGTERM at seeded random moments, killed with -9 during a checkpoint write, resumed
from a damaged checkpoint, and fed a non-finite loss."""

import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from conftest import ROOT, TWO_LAYER_FLAGS, checkpoint_state, xla_flags

SMOKE = ["--config=configs/transformer.py:numbers,smoke",
         "--config.train.log_every_steps=10", "--config.train.checkpoint_every_steps=10",
         "--config.train.eval_every_steps=50"]
ENV = {**os.environ, "XLA_FLAGS": xla_flags(1),
       "JAX_PLATFORMS": "cpu"}


def _start(workdir, *flags):
  return subprocess.Popen([sys.executable, "-m", "transformer_jax.main",
                           f"--workdir={workdir}", *SMOKE, *flags], cwd=ROOT, env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run(workdir, *flags):
  proc = _start(workdir, *flags)
  out = proc.communicate(timeout=600)[0]
  return proc.returncode, out


def _state(workdir, step):
  """Parameters and optimizer state of checkpoint `step`, as numpy arrays."""
  return jax.tree.map(np.asarray, checkpoint_state(workdir, step))


def _assert_identical(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_sigterm_at_random_steps_resumes_bit_identically(tmp_path):
  steps = 60
  whole, broken = str(tmp_path / "whole"), str(tmp_path / "broken")
  code, out = _run(whole, f"--config.train.num_train_steps={steps}")
  assert code == 0, out[-3000:]

  rng = random.Random(9)
  stopped_at = []
  for _ in range(5):  # Each run is stopped once, then resumed by the next.
    proc = _start(broken, f"--config.train.num_train_steps={steps}")
    lines = []
    for line in proc.stdout:  # Wait until the loop runs, then stop it at a random moment.
      lines.append(line)
      if "compiled" in line and "programs in" in line:
        # A restart compiles nothing the first run compiled: the persistent cache has it.
        count = re.search(r"compiled (\d+) programs in", line)[1]
        assert f"({count} of them from the compilation cache in " in line, line
        break
    time.sleep(rng.uniform(0.0, 1.0))
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 75, out[-3000:]
    step = int(out.split("checkpointed step ")[1].split(";")[0])
    assert os.path.isdir(os.path.join(broken, "checkpoints", str(step)))
    with open(os.path.join(broken, "exit.json")) as f:  # For launch.results.
      assert json.load(f)["code"] == 75
    stopped_at.append(step)
  code, out = _run(broken, f"--config.train.num_train_steps={steps}")
  assert code == 0, out[-3000:]
  assert not os.path.exists(os.path.join(broken, "exit.json"))  # Running again clears it.

  print(f"SIGTERM fault points tried: {len(stopped_at)}, stopped at steps {stopped_at}")
  assert len(set(stopped_at)) >= 3, stopped_at  # Really different points of the run.
  _assert_identical(_state(whole, steps), _state(broken, steps))


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
  workdir = str(tmp_path / "run")
  flags = ["--config.train.num_train_steps=400", "--config.train.checkpoint_every_steps=2",
           "--config.train.keep_checkpoints=3"]
  proc = _start(workdir, *flags)
  pattern = os.path.join(workdir, "checkpoints", "*.orbax-checkpoint-tmp*")
  deadline = time.time() + 300
  while not (glob.glob(pattern) and len(glob.glob(os.path.join(workdir, "checkpoints",
                                                                 "[0-9]*"))) >= 2):
    assert proc.poll() is None and time.time() < deadline, "no checkpoint write seen"
    time.sleep(0.002)
  proc.kill()  # SIGKILL while a step is being written.
  proc.communicate()
  print(f"kill -9 during the write of {[os.path.basename(p) for p in glob.glob(pattern)]}")

  code, out = _run(workdir, "--config.train.num_train_steps=60",
                   "--config.train.checkpoint_every_steps=100")
  assert code == 0, out[-3000:]
  assert "resumed from checkpoint at step" in out
  assert "corrupt" not in out
  assert not glob.glob(pattern)  # The half-written directory was cleaned up.


@pytest.mark.slow
def test_a_truncated_file_in_the_latest_checkpoint_falls_back_to_the_previous(tmp_path):
  workdir = str(tmp_path / "run")
  code, out = _run(workdir, "--config.train.num_train_steps=20")
  assert code == 0, out[-3000:]
  data_files = [f for f in glob.glob(os.path.join(workdir, "checkpoints", "20", "**", "*"),
                                     recursive=True)
                if os.path.isfile(f) and "/d/" in f]
  assert data_files
  victim = max(data_files, key=os.path.getsize)
  with open(victim, "r+b") as f:
    f.truncate(os.path.getsize(victim) // 2)

  code, out = _run(workdir, "--config.train.num_train_steps=30")
  assert code == 0, out[-3000:]
  assert "checkpoint step 20 is corrupt or incomplete" in out
  assert "config" not in out.split("checkpoint step 20 is corrupt")[1].split("\n")[0]
  assert "resumed from checkpoint at step 10" in out
  assert os.path.isdir(os.path.join(workdir, "unreadable_checkpoints", "20"))  # Kept.
  _ = _state(workdir, 30)


@pytest.mark.slow
@pytest.mark.parametrize("policy, inject, code", [
    ("stop", "3", 3),      # Stops at once; the run never saved a bad state.
    ("skip", "3,5,6", 3),  # 3 and 5 skipped and counted; 5, 6 in a row (max 2): stops.
])
def test_non_finite_losses_follow_the_policy(tmp_path, policy, inject, code):
  workdir = str(tmp_path / "run")
  got, out = _run(workdir, f"--config.train.on_nonfinite={policy}",
                  f"--config.train.inject_nonfinite_at={inject}",
                  "--config.train.max_nonfinite_in_row=2",
                  "--config.train.checkpoint_every_steps=2")
  assert got == code, out[-3000:]
  assert "non-finite loss or gradient at step" in out
  assert not os.path.exists(os.path.join(workdir, "results.json"))  # A failed run.
  with open(os.path.join(workdir, "exit.json")) as f:  # For launch.results.
    assert json.load(f)["code"] == 3
  # Saved before the stop: step 2, and with skip step 4, after step 3 was skipped.
  steps = sorted(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")))
  assert steps == ([2] if policy == "stop" else [2, 4])
  for step in steps:
    state = _state(workdir, step)
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state)
               if np.issubdtype(x.dtype, np.floating))
  if policy == "skip":
    assert "step 5: non-finite loss or gradient; update skipped (1 in a row, 2 in all)" in out
    assert "non-finite loss or gradient at step 6 (2 in a row" in out


@pytest.mark.slow
def test_a_full_disk_ends_the_run_in_one_line_and_the_same_command_resumes(tmp_path):
  """The workdir on a 1.7 MB tmpfs (a mount namespace of its own): the step-20 save has
  no room. One error line names the step, the path and the last good checkpoint; after
  the tmpfs grows, the same command resumes from step 10 and finishes."""
  disk = tmp_path / "disk"
  command = " ".join([sys.executable, "-m", "transformer_jax.main", f"--workdir={disk}/run",
                      *SMOKE, "--config.train.num_train_steps=20",
                      *TWO_LAYER_FLAGS])  # The tmpfs is sized to this model's saves.
  script = (f"cd {tmp_path} && mkdir -p disk && mount -t tmpfs -o size=1700k tmpfs disk && "
            f"cd {ROOT} && {{ {command} > {tmp_path}/first.log 2>&1; "
            f"echo $? > {tmp_path}/first.code; }}; mount -o remount,size=64m {disk} && "
            f"ls {disk}/run/checkpoints > {tmp_path}/kept.txt && {command} > "
            f"{tmp_path}/second.log 2>&1; echo $? > {tmp_path}/second.code; "
            f"ls {disk}/run > {tmp_path}/done.txt")
  unshare = ["unshare", "--mount"] + ["--map-root-user"] * (os.geteuid() != 0)
  subprocess.run([*unshare, "bash", "-c", script], timeout=600, env=ENV)
  first = (tmp_path / "first.log").read_text()
  assert (tmp_path / "first.code").read_text().strip() == "74", first[-3000:]
  [error] = [line for line in first.splitlines()  # Not a log line, nor the data's.
             if not line[:1] in ("I", "W") and not line.startswith("data: ")]
  assert error.startswith("error: no space left on the device of ") and "to save step 20" in error
  assert f"the last good checkpoint is step 10 ({tmp_path}/disk/run/checkpoints/10)" in error
  assert "Traceback" not in first
  assert (tmp_path / "kept.txt").read_text().split() == ["10"]
  second = (tmp_path / "second.log").read_text()
  assert (tmp_path / "second.code").read_text().strip() == "0", second[-3000:]
  assert "resumed from checkpoint at step 10" in second
  assert "results.json" in (tmp_path / "done.txt").read_text().split()


def test_a_bucket_over_quota_is_named_as_a_full_disk(tmp_path):
  """Orbax reports a failed write from its threads; the run turns it into one DiskFull."""
  from transformer_jax import checkpoint
  from transformer_jax.training import saving
  (tmp_path / "checkpoints" / "10").mkdir(parents=True)
  error = ValueError('RESOURCE_EXHAUSTED: Error writing "x" at "/w/checkpoints/'
                     '20.orbax-checkpoint-tmp/d": No space left on device')
  with pytest.raises(checkpoint.DiskFull, match=r"to save step 20; the last good "
                     r"checkpoint is step 10 \(.*checkpoints/10\)"):
    with saving.disk_full_named(str(tmp_path), lambda: 25):
      raise error
  with pytest.raises(KeyError):  # Anything else passes through.
    with saving.disk_full_named(str(tmp_path), lambda: 25):
      raise KeyError("other")


def test_a_stall_is_the_larger_of_the_timeout_and_20_median_steps():
  """train.stall_timeout_s: no beat for max(timeout, 20 x the median step) seconds is a
  stall; compiling before the first beat and paused stretches are not; processes other
  than the lead wait half as long again."""
  from transformer_jax.training import watchdog
  now = [0.0]
  dog = watchdog.Watchdog(10.0, clock=lambda: now[0])
  now[0] = 500.0  # Compiling: not armed yet.
  assert dog.stalled() is None
  for step in range(1, 6):  # Steps of 2 s: 20 x 2 = 40 s > 10 s.
    dog.beat(step)
    now[0] += 2.0
  assert dog.limit() == 40.0
  now[0] += 37.0
  assert dog.stalled() is None
  now[0] += 2.0
  assert dog.stalled() == pytest.approx(41.0)
  dog.pause()
  assert dog.stalled() is None
  other = watchdog.Watchdog(10.0, lead=False, clock=lambda: now[0])
  assert other.limit() == 15.0
