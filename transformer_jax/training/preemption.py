"""Stopping cleanly when asked: SIGTERM (a preempted VM, SLURM's time limit), SIGINT
(Ctrl-C) or, over several processes, JAX's preemption notice.

The training loop asks `stop.requested(step)` after every step; when it says yes, the
loop checkpoints that step and raises `Preempted`. A second signal ends the process at
once (exit code 128 + signal number), for a run that must die now.

With several processes, all must checkpoint the same step. JAX's preemption service
(started by `jax.distributed.initialize`) owns SIGTERM there: it tells every process
and `reached_preemption_sync_point(step)` turns true at the same step on all of them.
A SIGINT is forwarded to it as a SIGTERM, so Ctrl-C on one process stops them all.
(Orbax's `CheckpointManager.reached_preemption` asks the same service, but takes a
service that is switched off for "no preemption"; this falls back to the signal.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Iterator

import jax
from jax.experimental import multihost_utils


class Preempted(Exception):
  """The run stopped on request after checkpointing `step`."""

  def __init__(self, step: int, reason: str):
    super().__init__(f"{reason}: checkpointed step {step}; run the same command to "
                     "resume from it.")
    self.step = step


class StopRequest:
  """Set by the signal handlers; read by the training loop after each step."""

  def __init__(self):
    self.signal: int | None = None

  def requested(self, step: int) -> bool:
    if jax.process_count() > 1:  # All processes agree on the step.
      try:
        return multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError:  # The preemption service is off (jax_enable_preemption_service).
        return self.signal is not None
    return self.signal is not None

  @property
  def reason(self) -> str:
    return (f"received {signal.Signals(self.signal).name}" if self.signal
            else "preemption notice")


@contextlib.contextmanager
def watch() -> Iterator[StopRequest]:
  """Installs the handlers for the duration of the block (main thread only)."""
  stop = StopRequest()
  multi = jax.process_count() > 1

  def handle(signum, frame):
    if stop.signal is not None:
      logging.error("second %s: exiting now, without a checkpoint.",
                    signal.Signals(signum).name)
      os._exit(128 + signum)
    stop.signal = signum
    logging.warning("%s: finishing the step in flight, then checkpointing and stopping "
                    "(send it again to exit at once).", signal.Signals(signum).name)
    if multi and signum == signal.SIGINT:  # Tell every process, through JAX's service.
      os.kill(os.getpid(), signal.SIGTERM)

  # Over several processes, SIGTERM stays with JAX's preemption notifier.
  signals = (signal.SIGINT,) if multi else (signal.SIGINT, signal.SIGTERM)
  previous = {s: signal.signal(s, handle) for s in signals}
  try:
    yield stop
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
