"""A run resumed on another number of devices, processes or microbatches trains on the
same batches (README, "Resuming"): its parameters end where an uninterrupted run's do."""

import shutil

import pytest

from conftest import COMPARABLE_RUNS, checkpoint_state, max_relative_difference
from conftest import outputs_of, start_training

FLAGS = ["--config=configs/transformer.py:numbers,smoke", *COMPARABLE_RUNS,
         "--config.train.checkpoint_every_steps=10", "--config.train.eval_every_steps=10",
         "--config.decode.beam_size=1"]


def _train(workdir, steps, devices, *flags, processes=1):
  procs = start_training(workdir, [*FLAGS, f"--config.train.num_train_steps={steps}",
                                   *flags], processes, devices)
  for p, out in zip(procs, outputs_of(procs)):
    assert p.returncode == 0, out[-3000:]


@pytest.mark.slow
def test_resuming_on_other_devices_processes_and_microbatches_keeps_the_batches(tmp_path):
  """10 steps on 8 devices, then to step 20 on 2 devices, on 4 devices with 2
  microbatches, and as 2 processes of 2 devices; dropout off, so the batches alone
  decide the parameters. Measured (max |a - b| / max |b| of the worst tensor): 2e-6 to
  1.2e-5 from the uninterrupted run, up to 1.1e-4 seen with microbatches; 0.50 when the
  examples of a batch depend on the number of devices."""
  _train(tmp_path / "whole", 20, devices=8)
  _train(tmp_path / "first", 10, devices=8)
  resumes = {"2 devices": ((2,), {}), "4 devices, grad_accum 2": (
      (4, "--config.train.grad_accum_steps=2"), {}), "2 processes": ((2,), {"processes": 2})}
  whole = checkpoint_state(tmp_path / "whole", 20)["params"]
  differences = {}
  for name, (args, kwargs) in resumes.items():
    workdir = tmp_path / name.replace(" ", "_").replace(",", "")
    shutil.copytree(tmp_path / "first", workdir)
    _train(workdir, 20, args[0], *args[1:], **kwargs)
    differences[name] = max_relative_difference(
        checkpoint_state(workdir, 20)["params"], whole)
  assert max(differences.values()) < 1e-3, differences
