"""Which launcher trains which trial of a search, known from the study itself: launchers
on machines that share no folder (each its own --root) share one study correctly.

The launcher that trains a trial holds it: a record in the trial's user attrs (its host,
process, a token and a count of heartbeats), renewed every HEARTBEAT_S seconds from a
thread. Optuna's own heartbeats (RDBStorage's heartbeat_interval, fail_stale_trials)
exist for RDB storages only, not for the journal a SLURM search keeps by default, and
they end a stale trial as FAIL, to be retried as another trial (another number, another
Hyperband bracket, its evaluations reported twice); this record covers SQLite,
PostgreSQL and the journal alike, and a stale trial is resumed as itself.

A RUNNING trial is free to take when its holder released it (a failure to retry, a
stop), when its holder ran on this host and its process is gone (kill -9), or when this
launcher has seen its record unchanged for STALE_S seconds of its own monotonic clock
(a dead machine: two hosts' wall clocks are never compared). Seeing is never waited
for: a launcher draws new trials meanwhile and looks again at its next draw. Taking is
writing one's own record, then reading it back after SETTLE_S: of two launchers that
take a trial at once, the one whose record is read back holds it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from transformer_jax.training import workdir_lock

KEY = "launcher"  # The trial's user attr that holds its launcher's record.
HEARTBEAT_S = 30.0
STALE_S = 150.0  # Five heartbeats missed.
SETTLE_S = 2.0


def settle() -> None:
  """The pause between writing a record and reading it back (a hook for tests)."""
  time.sleep(SETTLE_S)


def _record(study, number: int) -> tuple[str, dict | None]:
  """(the trial's state name, its launcher's record)."""
  frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == number)
  return frozen.state.name, frozen.user_attrs.get(KEY)


class Hold:
  """This launcher's hold on a RUNNING trial, renewed from a thread until `release`."""

  def __init__(self, study, trial):
    self.study, self.trial = study, trial
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "process_start": workdir_lock._process_start(os.getpid()),
                   "token": uuid.uuid4().hex, "beats": 0}
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def write(self) -> None:
    self.trial.set_user_attr(KEY, dict(self.record))

  def ours(self) -> bool:
    """Whether the trial is RUNNING and its record is this hold's."""
    state, record = _record(self.study, self.trial.number)
    return state == "RUNNING" and (record or {}).get("token") == self.record["token"]

  def start(self) -> Hold:
    self._thread = threading.Thread(target=self._beat, daemon=True,
                                    name=f"heartbeat of trial {self.trial.number}")
    self._thread.start()
    return self

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      try:
        if not self.ours():  # Told (it ended), or taken by another launcher.
          return
        self.record["beats"] += 1
        self.write()
      except Exception as e:  # A storage that cannot be reached now: try at the next.
        logging.warning("trial %d: heartbeat not recorded (%s)", self.trial.number, e)

  def release(self) -> None:
    """Ends the hold. A trial still RUNNING (a failure to retry, a stopped launcher) is
    marked released: the next launcher to draw, this one included, takes it at once."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    try:
      if self.ours():
        self.record["released"] = True
        self.write()
    except Exception as e:  # It goes stale instead, and is taken after STALE_S.
      logging.warning("trial %d: release not recorded (%s)", self.trial.number, e)


def hold(study, trial) -> Hold:
  """A new hold on `trial`, just asked for by this launcher (no other can have it)."""
  held = Hold(study, trial)
  held.write()
  return held.start()


class Seen:
  """What this launcher has seen of other launchers' trials: a record unchanged for
  STALE_S is a dead launcher's."""

  def __init__(self):
    self.first: dict[int, tuple[str, float]] = {}  # number -> (record, first seen)

  def why_free(self, frozen) -> str | None:
    """Why trial `frozen` (RUNNING) is free to take, in words, or None while it may be
    alive."""
    record = frozen.user_attrs.get(KEY)
    if record and record.get("released"):
      return "released by its launcher"
    if record and record.get("host") == socket.gethostname() and "pid" in record:
      if not workdir_lock._running(int(record["pid"]), record.get("process_start")):
        return "left running by a launcher that stopped"
      return None
    text, now = json.dumps(record, sort_keys=True), time.monotonic()
    if self.first.get(frozen.number, ("",))[0] != text:
      self.first[frozen.number] = (text, now)
    if now - self.first[frozen.number][1] >= STALE_S:
      return f"left running by a launcher whose heartbeat stopped ({STALE_S:.0f} s)"
    return None


def take(study, trial, frozen) -> Hold | None:
  """This launcher's hold on `trial` (`frozen` as it was seen free), or None where
  another launcher took or told it meanwhile."""
  state, record = _record(study, trial.number)
  if state != "RUNNING" or record != frozen.user_attrs.get(KEY):
    return None
  held = Hold(study, trial)
  held.write()
  settle()
  return held.start() if held.ours() else None
