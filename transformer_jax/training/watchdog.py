"""Noticing a stuck run: a step, a collective or a checkpoint save that never ends.

On a pod, a host that stops arriving at a collective leaves every other host waiting
inside it with no error. The training loop calls `beat(step)` after each step; a
thread checks that beats keep coming. If none came for `limit` seconds (the larger of
train.stall_timeout_s and 20 times the median step), it logs why, dumps every
thread's stack to stderr (where the stuck one waits), records exit.json with code 75
(what the launchers relaunch, from the last checkpoint) and ends the process at once:
a thread stuck in a collective cannot be interrupted.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterator

import jax

EXIT_STALLED = 75  # cli.EXIT_PREEMPTED: the launchers relaunch it.


class Watchdog:
  """Beats from the training loop; `check()` says whether they stopped coming."""

  def __init__(self, timeout_s: float, lead: bool = True,
               clock: Callable[[], float] = time.monotonic):
    self.timeout_s, self.lead, self.clock = timeout_s, lead, clock
    self.last, self.step, self.armed = clock(), 0, False
    self.intervals: collections.deque[float] = collections.deque(maxlen=100)

  def beat(self, step: int) -> None:
    """Progress at `step`; the first beat arms the watchdog (compiling comes before)."""
    now = self.clock()
    if self.armed and step == self.step + 1:  # Times a step (not a pause or a resume).
      self.intervals.append(now - self.last)
    self.last, self.step, self.armed = now, step, True

  def pause(self) -> None:
    """No stall is noticed until the next beat (the final evaluation, say)."""
    self.armed = False

  def limit(self) -> float:
    """Seconds without a beat that count as a stall. Processes other than the lead wait
    half as long again, so that the lead, which writes exit.json, notices first (a
    process that exits first breaks the collective the others wait in)."""
    typical = sorted(self.intervals)[len(self.intervals) // 2] if self.intervals else 0.0
    return max(self.timeout_s, 20 * typical) * (1.0 if self.lead else 1.5)

  def stalled(self) -> float | None:
    """Seconds since the last beat if over the limit, else None."""
    quiet = self.clock() - self.last
    return quiet if self.armed and quiet > self.limit() else None


@contextlib.contextmanager
def watch(timeout_s: float, on_stall: Callable[[str], None], lead: bool = True
          ) -> Iterator[Watchdog]:
  """A Watchdog whose thread, while the block runs, calls `on_stall(reason)` (which
  records it), dumps every thread's stack and exits the process with EXIT_STALLED on
  a stall. timeout_s <= 0 turns it off."""
  dog = Watchdog(timeout_s, lead)
  done = threading.Event()

  def run():
    while not done.wait(min(max(timeout_s / 20, 0.2), 10.0)):
      quiet = dog.stalled()
      if quiet is None:
        continue
      reason = (f"stalled: no progress for {quiet:.0f} s after step {dog.step} (limit "
                f"{dog.limit():.0f} s: train.stall_timeout_s or 20 x the median step)")
      logging.error("%s; the stacks of every thread follow, then exit %d (relaunch "
                    "resumes from the last checkpoint).", reason, EXIT_STALLED)
      sys.stderr.flush()
      faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
      try:
        on_stall(reason)
      finally:
        sys.stderr.flush()
        os._exit(EXIT_STALLED)

  thread = threading.Thread(target=run, name="watchdog", daemon=True)
  if timeout_s > 0:
    thread.start()
  try:
    yield dog
  finally:
    done.set()


def inject_stall(inject_stall_at: tuple[int, ...], step: int) -> None:
  """Fault injection (train.inject_stall_at = (step, process)): that process hangs
  before that step, as a stuck host would; the others wait in its collective."""
  if inject_stall_at and tuple(inject_stall_at) == (step, jax.process_index()):
    logging.warning("train.inject_stall_at: process %d hangs before step %d",
                    jax.process_index(), step)
    threading.Event().wait()
