"""A run resumed on another number of devices, processes or microbatches trains on the
same batches (README, "Exact resume, on any devices"): its parameters end where an
uninterrupted run's do."""

import shutil

import pytest

from conftest import COMPARABLE_RUNS, ROUNDING_CONTROL, assert_within_rounding
from conftest import checkpoint_state, max_relative_difference
from conftest import outputs_of, start_training

FLAGS = ["--config=configs/transformer.py:numbers,smoke", *COMPARABLE_RUNS,
         "--config.train.checkpoint_every_steps=10", "--config.train.eval_every_steps=10",
         "--config.decode.beam_size=1", "--config.data.num_eval_examples=8"]


def _train(workdir, steps, devices, *flags):
  procs = start_training(workdir, [*FLAGS, f"--config.train.num_train_steps={steps}",
                                   *flags], 1, devices)
  for p, out in zip(procs, outputs_of(procs)):
    assert p.returncode == 0, out[-3000:]


@pytest.mark.slow
def test_resuming_on_other_devices_and_microbatches_keeps_the_batches(tmp_path):
  """20 steps on 8 devices; its step-10 checkpoint resumed to step 20 on 2 devices, and
  on 4 devices with 2 microbatches (test_multiprocess: on 2 processes); dropout off, so
  the batches alone decide the parameters. Each ends within ROUNDING_K times the
  control (the 8-device run from parameters one ulp away, conftest) of the
  uninterrupted run; when the examples of a batch depend on the number of devices,
  0.50 apart."""
  whole, control = tmp_path / "whole", tmp_path / "control"
  _train(whole, 20, 8)  # Keeps the checkpoints of steps 10 and 20.
  _train(control, 20, 8, ROUNDING_CONTROL)
  params = lambda workdir: checkpoint_state(workdir, 20)["params"]
  differences = {}
  for name, devices, flags in (("2 devices", 2, []),
                               ("4 devices, grad_accum 2", 4,
                                ["--config.train.grad_accum_steps=2"])):
    workdir = tmp_path / name.replace(" ", "_").replace(",", "")
    shutil.copytree(whole, workdir)
    shutil.rmtree(workdir / "checkpoints" / "20")  # As if stopped after step 10.
    (workdir / "results.json").unlink()
    _train(workdir, 20, devices, *flags)
    differences[name] = max_relative_difference(params(workdir), params(whole))
  control_difference = max_relative_difference(params(control), params(whole))
  assert_within_rounding(differences, {name: control_difference for name in differences})
