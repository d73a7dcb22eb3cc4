"""One writer per workdir: a lease in WORKDIR/lock.json.

The training process that holds the lease (process 0 of a run) records its host, process
id and start time there, and renews a heartbeat every HEARTBEAT_S seconds from a thread.
Another start on the same workdir is refused with one line naming the holder, unless the
holder is gone: on the same host, a process id that no longer runs (kill -9); on another
host (a preempted VM, a requeued SLURM job), a heartbeat that stops. Another host's
lease is watched until its heartbeat count moves (the holder lives: refused) or
EXPIRES_S pass on this host's monotonic clock without it moving (taken over): two
hosts' wall clocks are never compared, so a live holder whose clock is minutes off is
never taken, and a relaunch waits at most EXPIRES_S.

A local or shared (NFS, Lustre) workdir is taken by an exclusive link, atomic on POSIX
filesystems. An object store (gs://) has no exclusive create through epath: the lease is
written, then read back after SETTLE_S, and held only if it is still ours (the stores
read back what was last written), so two starts at once cannot both hold it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Iterator

from etils import epath

from transformer_jax import files

NAME = "lock.json"
HEARTBEAT_S = 10.0
EXPIRES_S = 60.0
SETTLE_S = 2.0


class Busy(Exception):
  """Another live process holds the workdir."""


class Lost(Exception):
  """This process's lease was taken by another (its heartbeat had stopped too long)."""


def _process_start(pid: int) -> str | None:
  """The kernel's start time of process `pid` (tells a reused pid apart); None where
  /proc does not say."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _running(pid: int, start: str | None) -> bool:
  """Whether process `pid`, started at `start`, still runs on this host."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # Another user's: it runs.
  return start is None or _process_start(pid) in (None, start)


def describe(holder: dict) -> str:
  """The holder, in words: process 1234 on host vm, started ..., heartbeat 3 s ago."""
  started = datetime.datetime.fromtimestamp(holder.get("started", 0), datetime.timezone.utc)
  age = time.time() - holder.get("heartbeat", 0)
  return (f"process {holder.get('pid')} on host {holder.get('host')} (started "
          f"{started:%Y-%m-%d %H:%M:%S} UTC, last heartbeat {age:.0f} s ago)")


class Lease:
  """The workdir's lease while held: `release` ends it, `check` raises Lost if it was
  taken over."""

  def __init__(self, workdir: epath.PathLike):
    self.path = epath.Path(workdir) / NAME
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "process_start": _process_start(os.getpid()), "token": uuid.uuid4().hex,
                   "started": time.time(), "heartbeat": time.time(), "beats": 0}
    self._stop = threading.Event()
    self._lost: dict | None = None
    self._thread: threading.Thread | None = None

  def _text(self) -> str:
    return json.dumps(self.record, indent=1)

  def _read(self, path: epath.Path | None = None) -> dict | None:
    """The lease on disk (or at `path`); None when there is none; {} when it is
    unreadable (leases are written whole, by a link or a rename: a damaged one, which
    counts as expired)."""
    try:
      return json.loads((path or self.path).read_text())
    except FileNotFoundError:
      return None
    except (ValueError, OSError):
      return {}

  def _create(self) -> bool:
    """Writes the lease if there is none; True if this process now holds it."""
    if files.is_remote(self.path):
      if self.path.exists():
        return False
      files.write_atomic(self.path, self._text())
      time.sleep(SETTLE_S)
      return (self._read() or {}).get("token") == self.record["token"]
    tmp = self.path.with_name(f"{NAME}.{self.record['token']}")
    try:
      with files.naming(tmp):
        tmp.write_text(self._text())
      os.link(tmp, self.path)  # Fails if the lease exists, on local and NFS alike.
      return True
    except FileExistsError:
      return False
    finally:
      tmp.unlink(missing_ok=True)

  def _holder_state(self, holder: dict) -> str:
    """"alive", "gone" (the process that wrote `holder` has ended) or "changed" (the
    lease was released or taken meanwhile). Another host's lease is watched for up to
    EXPIRES_S (this host's monotonic clock): alive if its heartbeat moves meanwhile."""
    if not holder:
      return "gone"  # Unreadable: a lease is always written whole, so a damaged one.
    if holder.get("host") == self.record["host"] and "pid" in holder:
      return "alive" if _running(int(holder["pid"]), holder.get("process_start")) else "gone"
    logging.warning("%s is held by %s: waiting up to %.0f s to see whether its heartbeat "
                    "moves", self.path, describe(holder), EXPIRES_S)
    beat = lambda lease: (lease.get("beats"), lease.get("heartbeat"))
    deadline = time.monotonic() + EXPIRES_S
    while time.monotonic() < deadline:
      time.sleep(min(HEARTBEAT_S / 2, max(deadline - time.monotonic(), 0)))
      now = self._read()
      if now is None or now.get("token") != holder.get("token"):
        return "changed"
      if beat(now) != beat(holder):
        return "alive"
    return "gone"

  def _busy(self, holder: dict) -> Busy:
    return Busy(f"{self.path.parent} is in use by {describe(holder)}: one run writes a "
                "workdir at a time. Wait for it to end (or stop it), or use another "
                "--workdir.")

  def acquire(self) -> "Lease":
    """Takes the lease, or raises Busy naming its live holder."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(5):  # Each round ends one way, unless other starts race this one.
      if self._create():
        break
      holder = self._read()
      if holder is None:
        continue  # Released meanwhile.
      state = self._holder_state(holder)
      if state == "alive":
        raise self._busy(holder)
      if state == "changed":
        continue
      stale = self.path.with_name(f"{NAME}.stale.{self.record['token']}")
      try:  # Moved, not deleted: of two starts taking it over, only one moves it.
        self.path.rename(stale)
      except FileNotFoundError:
        continue
      taken = self._read(stale) or {}
      if holder and taken.get("token") != holder.get("token"):
        # Another start's fresh lease, written after this one read the stale lease.
        with contextlib.suppress(OSError):
          stale.rename(self.path)
        raise self._busy(taken)
      stale.unlink(missing_ok=True)
      logging.warning("took over the lease of %s from %s, which has ended",
                      self.path.parent, describe(holder) if holder else "a damaged lease")
    else:
      raise Busy(f"{self.path.parent}: could not take {self.path} in 5 tries: other "
                 "starts keep taking it.")
    self._thread = threading.Thread(target=self._beat, name="workdir-lease", daemon=True)
    self._thread.start()
    return self

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      now = self._read()
      if now is None:
        if self._create():
          continue  # Removed by hand: taken back.
        now = self._read()
      if now is None or now.get("token") != self.record["token"]:
        self._lost = now or {}
        logging.error("lost the lease of %s to %s: this run stops before its next write",
                      self.path.parent, describe(now) if now else "nobody (it was removed)")
        return
      self.record["heartbeat"] = time.time()
      self.record["beats"] += 1  # What another host watches: its clock may be off.
      try:
        files.write_atomic(self.path, self._text())
      except OSError as e:  # A full disk, say: the lease stands until it expires.
        logging.warning("could not renew the lease %s: %s", self.path, e)

  def check(self) -> None:
    """Raises Lost if another process took the lease (before this one writes more)."""
    if self._lost is not None:
      raise Lost(f"another process took the lease of {self.path.parent} "
                 f"({describe(self._lost) if self._lost else 'it was removed'}) while this "
                 "one's heartbeat had stopped; this run stops without writing more.")

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if self._lost is None and (self._read() or {}).get("token") == self.record["token"]:
      self.path.unlink(missing_ok=True)


def live_holder(workdir: epath.PathLike) -> dict | None:
  """The lease's holder if a live process (of this or another launcher) writes the
  workdir now, else None; another host's is watched as `acquire` watches it."""
  lease = Lease(workdir)
  holder = lease._read()
  if not holder:
    return None
  return holder if lease._holder_state(holder) == "alive" else None


@contextlib.contextmanager
def held(workdir: epath.PathLike) -> Iterator[Lease]:
  """The workdir's lease for the block; raises Busy if another process holds it."""
  lease = Lease(workdir).acquire()
  try:
    yield lease
  finally:
    lease.release()
