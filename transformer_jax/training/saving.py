"""When the loop writes checkpoints, so that no step waits on the store.

Orbax writes a checkpoint in the background once it has copied the step's arrays to
the host, and a save started while the previous one is still being written waits for
it. With train.defer_checkpoints, a checkpoint that train.checkpoint_every_steps makes
due then is deferred instead: it is written at the first step after the previous one
is done, of that step's state; and, with one process, Orbax's save (its host copy)
runs in a thread of its own, on a copy of the state on the devices (one more state in
device memory while it is copied).

Only the checkpoints that must be of their own step wait: the last step's, the best so
far (train.keep_best_by), the one where the patience is spent, and a preemption's. The
averaging snapshots never depend on it: they are summed on the devices at their steps
(training/averaging.py). So on a store slower than the cadence the run keeps fewer
checkpoints on disk, each of a step as late as the store allows, and loses no step's
time; on a fast one every checkpoint is of its cadence's step, as before.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from typing import Callable

import jax
import jax.experimental.multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from transformer_jax import checkpoint, config as config_lib, files
from transformer_jax.training import averaging, cadence, nonfinite


class Saver:
  """The loop's checkpoints: `after_step` at every step, `save` (forced) on a
  preemption, `wait` before the final evaluation. Its `guard` holds the steps'
  non-finite flags (nonfinite.NonFiniteGuard, which the loop also checks at its log
  windows): a checkpoint never holds the state after a non-finite step."""

  def __init__(self, ckpt: ocp.CheckpointManager, workdir: str,
               cfg: config_lib.TrainConfig, window: averaging.Window):
    self.ckpt, self.workdir, self.cfg, self.window = ckpt, workdir, cfg, window
    self.guard = nonfinite.NonFiniteGuard(cfg, ckpt)
    self.pending = None  # The step at which a deferred checkpoint became due.
    self.deferred = 0  # Due checkpoints deferred so far.
    self.saved = 0  # Checkpoints started.
    self.writing: int | None = None  # The step of the latest save started: a failure
    # that Orbax's threads report later is that save's.
    # Orbax's save copies the arrays to the host before it returns: a deferred save
    # hands it a copy on the devices, in this thread, so the step goes on meanwhile.
    self._thread = concurrent.futures.ThreadPoolExecutor(1, "checkpoint")
    self._job: concurrent.futures.Future | None = None

  def after_step(self, done: int, state, now: bool = False,
                 metrics: dict | None = None) -> None:
    """Saves step `done` if a checkpoint is due (or deferred) and the previous one is
    written; `now`: a checkpoint of this very step, waiting for the previous if it must
    (also the last step's). `metrics`: what it is saved with (early_stopping.Best)."""
    last = self.cfg.num_train_steps
    due = cadence.due(done, self.cfg.checkpoint_every_steps, last)
    now = now or done == last
    if not (now or due or self.pending):
      return
    if not now and self.cfg.defer_checkpoints and not self._previous_written(done):
      if self.pending is None:
        self.pending, self.deferred = done, self.deferred + 1
        if self.deferred == 1:
          logging.info("step %d: a checkpoint is due; it is written at the first step "
                       "at which the previous one is known to be written (%s)", done,
                       "the processes agree on that at train.log_every_steps' cadence"
                       if jax.process_count() > 1 else "the store is slower than "
                       "train.checkpoint_every_steps' cadence")
      return
    # Over several processes Orbax's save synchronizes them with collectives on the
    # devices, which must come in the same order as the steps': there it stays here.
    self.save(done, state, metrics, background=not now and self.cfg.defer_checkpoints
              and jax.process_count() == 1)

  def save(self, step: int, state, metrics: dict | None = None, force: bool = False,
           background: bool = False) -> None:
    """Checkpoint `step` (with the averaging window's sum inside the window); with
    `background`, of a copy on the devices, saved by the saver's thread once the
    previous save is finalized (Orbax deletes old checkpoints then)."""
    self.guard.check()  # A checkpoint never holds the state after a non-finite step.
    self._collect()
    if not background:
      # The previous save done first: the space check sees its files, and a full disk
      # names it as the last good checkpoint (Orbax's save would wait anyway).
      self.ckpt.wait_until_finished()
    # In the background, of a copy: the state's own buffers go to the next step (donated).
    tree = self.window.saved(state, copy=background)
    checkpoint.check_space(self.workdir, step, tree)
    save = lambda: self.ckpt.save(step, args=ocp.args.StandardSave(tree), metrics=metrics,
                                  force=force)
    self.writing = step
    if background:
      self._job = self._thread.submit(lambda: (self.ckpt.wait_until_finished(), save()))
    else:
      save()
    self.pending, self.saved = None, self.saved + 1

  def wait(self) -> None:
    """Until the checkpoints started are written; raises a save's error (a full disk)."""
    self._collect()
    self.ckpt.wait_until_finished()

  def _collect(self) -> None:
    """Waits for the thread's save, if any, raising its error."""
    job, self._job = self._job, None
    if job is not None:
      job.result()

  def _previous_written(self, done: int) -> bool:
    """Whether no save is in progress, as every process agrees; errors of a finished
    save (a full bucket) are raised here. With several processes they agree at the
    log cadence (a collective, where the loop waits for its metrics anyway)."""
    busy = (self._job is not None and not self._job.done()) or \
        self.ckpt.is_saving_in_progress()
    if jax.process_count() > 1:
      if not cadence.due(done, self.cfg.log_every_steps, self.cfg.num_train_steps):
        return False
      busy = bool(jax.experimental.multihost_utils.process_allgather(np.array([busy])).any())
    if not busy:  # Raises what went wrong in the thread, or in Orbax's.
      self._collect()
      self.ckpt.check_for_errors()
    return not busy


@contextlib.contextmanager
def disk_full_named(workdir: str, step: Callable[[], int]):
  """A full disk, as Orbax's writer threads report it, becomes one DiskFull naming the
  step being saved (`step()`) and the last good checkpoint."""
  try:
    yield
  except Exception as e:
    if files.out_of_space(e):
      raise checkpoint.disk_full(workdir, step(), e) from None
    raise
