"""The host side of the non-finite policy (train.on_nonfinite): the step skips a
non-finite update on the device (`step.train_step`); the guard reads its flags at log
windows and before checkpoints, and stops the run when the policy says so."""

from __future__ import annotations

import logging

import jax
import orbax.checkpoint as ocp

from transformer_jax import config as config_lib


class NonFiniteError(RuntimeError):
  """Training stopped on non-finite losses or gradients (per train.on_nonfinite)."""


class NonFiniteGuard:
  """Host side of the non-finite policy: reads the steps' `skipped_steps` flags only
  when asked (at log windows and before checkpoints), so no step waits on the host."""

  def __init__(self, cfg: config_lib.TrainConfig, ckpt: ocp.CheckpointManager):
    self.cfg, self.ckpt = cfg, ckpt
    self.pending: list[tuple[int, jax.Array]] = []
    self.in_row = self.skipped = 0

  def add(self, step: int, flag: jax.Array) -> None:
    self.pending.append((step, flag))

  def check(self) -> None:
    """Raises NonFiniteError if the policy says stop."""
    for step, flag in self.pending:
      if not int(flag):
        self.in_row = 0
        continue
      self.in_row, self.skipped = self.in_row + 1, self.skipped + 1
      logging.warning("step %d: non-finite loss or gradient; update skipped (%d in a row, "
                      "%d in all).", step, self.in_row, self.skipped)
      stop = self.cfg.on_nonfinite == "stop" or self.in_row >= self.cfg.max_nonfinite_in_row
      if stop:
        self.ckpt.wait_until_finished()
        last = self.ckpt.latest_step()
        raise NonFiniteError(
            f"non-finite loss or gradient at step {step} ({self.in_row} in a row; "
            f"train.on_nonfinite={self.cfg.on_nonfinite!r}, train.max_nonfinite_in_row="
            f"{self.cfg.max_nonfinite_in_row}); no update was applied. Last good "
            f"checkpoint: {'none' if last is None else f'step {last}'} in "
            f"{self.ckpt.directory}.")
    self.pending = []
