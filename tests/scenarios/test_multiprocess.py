"""Two processes on localhost (CPU collectives) train like one process."""

import re
import shutil
import signal

import pytest

from conftest import COMPARABLE_RUNS, ROOT, ROUNDING_CONTROL, assert_within_rounding
from conftest import checkpoint_state, max_relative_difference, outputs_of
from conftest import relative_differences, start_training

from transformer_jax import distributed, summaries

OVERRIDES = [
    "--config=configs/transformer.py:numbers",
    "--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.d_ff=64",
    "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
    "--config.data.num_train_examples=2000", "--config.data.num_eval_examples=16",
    "--config.data.max_length=32", "--config.train.batch_tokens=512",
    "--config.train.max_length_buckets=2",  # Fewer programs to compile per run.
    "--config.train.log_every_steps=5", "--config.train.eval_every_steps=10",
    "--config.train.checkpoint_every_steps=10", "--config.train.num_eval_batches=1",
    "--config.optimizer.warmup_steps=10", "--config.decode.batch_size=16",
    "--config.decode.beam_size=2", *COMPARABLE_RUNS,
]


def _run(workdir, steps, processes, devices_per_process, terminate_process=None,
         expect=0, flags=()):
  """Runs a trial of `processes` processes; with `terminate_process`, that process
  gets SIGTERM once the first process has started training."""
  procs = start_training(workdir, [*OVERRIDES, f"--config.train.num_train_steps={steps}",
                                   *flags], processes, devices_per_process)
  first_output = []
  if terminate_process is not None:
    for line in procs[0].stdout:
      first_output.append(line)
      if "compiled" in line and "step 1 starts" in line:
        procs[terminate_process].send_signal(signal.SIGTERM)
        break
  outputs = outputs_of(procs)
  outputs[0] = "".join(first_output) + outputs[0]
  for p, out in zip(procs, outputs):
    assert p.returncode == expect, out[-3000:]
  return outputs


TAGS = ("train/loss", "train/grad_norm")  # Compared window by window.


def _params(workdir, step):
  return checkpoint_state(workdir, step)["params"]


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume_like_one(tmp_path):
  """Two processes of two devices take the same steps as one process of eight (the
  batches do not depend on the devices): each logged window's loss and gradient norm,
  and the parameters after 20 steps, within ROUNDING_K times the control (the one
  process from parameters one ulp away, conftest). Also the multi-process preemption:
  SIGTERM to process 1 alone reaches both through JAX's preemption service; both
  checkpoint the same step and exit 75, and the resumed run ends where an
  uninterrupted one does."""
  two, one, control = (str(tmp_path / name) for name in ("two", "one", "control"))
  stopped = _run(two, 20, processes=2, devices_per_process=2, terminate_process=1,
                 expect=75)
  steps = {int(re.search(r"stopped at step (\d+)", out).group(1)) for out in stopped}
  assert len(steps) == 1 and 0 < min(steps) < 20, stopped[0][-3000:]
  [stop_step] = steps
  outputs = _run(two, 20, processes=2, devices_per_process=2)  # Resumes from there.
  _run(one, 20, processes=1, devices_per_process=8)
  _run(control, 20, processes=1, devices_per_process=8, flags=[ROUNDING_CONTROL])

  assert f"resumed from checkpoint at step {stop_step}" in outputs[0]
  assert "Held-out" in outputs[0] and "Held-out" not in outputs[1]  # Process 0 reports.
  # Windows of 5 steps (log_every_steps); the stop splits the one around it.
  whole = [s for s in (5, 10, 15, 20) if s <= stop_step or s - 5 >= stop_step]

  def windows(workdir):
    scalars = summaries.read_scalars(workdir)
    by_step = {tag: {step: value for step, value, _ in scalars[tag]} for tag in TAGS}
    return [{tag: by_step[tag][step] for tag in by_step} for step in whole]

  def differences(run):
    return {**relative_differences(windows(run), windows(one), TAGS),
            "params": max_relative_difference(_params(run, 20), _params(one, 20))}
  assert_within_rounding(differences(two), differences(control))


def test_processes_that_import_different_code_stop_in_one_line(tmp_path):
  """Process 1 runs a copy of the code with one comment changed: both processes refuse
  to start, each naming both fingerprints."""
  copy = tmp_path / "copy"
  shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__"))
  with open(copy / "transformer_jax" / "model" / "transformer.py", "a") as f:
    f.write("# A local edit on one host.\n")
  procs = start_training(tmp_path / "run", OVERRIDES, 2, code_dirs=[ROOT, copy],
                         prepare=False)
  theirs, mine = distributed.code_fingerprint(str(copy)), distributed.code_fingerprint()
  for p, out in zip(procs, outputs_of(procs)):
    assert p.returncode == 2, out[-3000:]
    [error] = [line for line in out.splitlines() if line.startswith("error:")]
    assert f"import different code (process 0: {mine}, process 1: {theirs}; " in error
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_stalled_process_is_noticed_and_the_run_exits_for_a_relaunch(tmp_path):
  """train.stall_timeout_s, 20 s: process 1 hangs before step 8 (inject_stall_at), as a
  stuck host would; process 0 waits in its collective. Process 0 notices first, logs
  every thread's stack, records exit.json with code 75 (what the launchers relaunch)
  and exits 75; JAX's coordination service then ends the hung process (or its own
  watchdog does). The same command, without the fault, resumes from the checkpoint at
  step 5 and finishes."""
  import json
  import os
  workdir = str(tmp_path / "run")
  flags = [*OVERRIDES, "--config.train.num_train_steps=12",
           "--config.train.checkpoint_every_steps=5"]
  procs = start_training(workdir, [*flags, "--config.train.stall_timeout_s=20",
                                   "--config.train.inject_stall_at=(8,1)"], 2, 1)
  outputs = outputs_of(procs, timeout=300)
  assert procs[0].returncode == 75, outputs[0][-3000:]
  assert "stalled: no progress for" in outputs[0] and "Thread 0x" in outputs[0]
  assert procs[1].returncode != 0 and "hangs before step 8" in outputs[1]
  with open(os.path.join(workdir, "exit.json")) as f:
    record = json.load(f)
  assert record["code"] == 75 and record["reason"].startswith("stalled"), record
  # A generous limit: on a busy machine one process can lag the other by seconds.
  procs = start_training(workdir, [*flags, "--config.train.stall_timeout_s=300"], 2, 1)
  outputs = outputs_of(procs, timeout=300)
  assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:]
  assert "resumed from checkpoint at step 5" in outputs[0]
