"""One writer per workdir (transformer_jax/training/workdir_lock.py): the lease, its heartbeat,
and what becomes of a lease whose holder has ended, here or on another host."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, assert_one_line_error, run_commands
from transformer_jax.training import workdir_lock


@pytest.fixture
def quick(monkeypatch):
  """Heartbeats and expiry in fractions of a second."""
  monkeypatch.setattr(workdir_lock, "HEARTBEAT_S", 0.1)
  monkeypatch.setattr(workdir_lock, "EXPIRES_S", 1.0)
  monkeypatch.setattr(workdir_lock, "SETTLE_S", 0.05)


def _lease_of(workdir) -> dict:
  return json.loads((workdir / workdir_lock.NAME).read_text())


def _write_lease(workdir, **record):
  """Another process's lease, written whole as the holder's are (a rename)."""
  workdir.mkdir(exist_ok=True)
  tmp = workdir / "other.tmp"
  tmp.write_text(json.dumps({"host": "elsewhere", "pid": 1, "token": "theirs",
                             "started": time.time(), "heartbeat": time.time(), **record}))
  os.replace(tmp, workdir / workdir_lock.NAME)


def test_of_starts_racing_for_one_workdir_exactly_one_holds_it(tmp_path):
  results = []
  def start():
    try:
      results.append(workdir_lock.Lease(tmp_path).acquire())
    except workdir_lock.Busy as e:
      results.append(str(e))
  threads = [threading.Thread(target=start) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  held = [r for r in results if isinstance(r, workdir_lock.Lease)]
  assert len(held) == 1, results
  assert all(f"is in use by process {os.getpid()} on host" in r
             for r in results if isinstance(r, str))
  assert _lease_of(tmp_path)["token"] == held[0].record["token"]
  held[0].release()
  assert not (tmp_path / workdir_lock.NAME).exists()
  assert sorted(os.listdir(tmp_path)) == []  # No temporary left behind.


def test_the_holder_renews_its_heartbeat_and_a_release_frees_the_workdir(tmp_path, quick):
  with workdir_lock.held(tmp_path) as lease:
    first = _lease_of(tmp_path)["heartbeat"]
    time.sleep(0.5)
    assert _lease_of(tmp_path)["heartbeat"] > first
    lease.check()  # Still ours.
  workdir_lock.Lease(tmp_path).acquire().release()  # Free again.


def test_a_lease_left_by_a_killed_process_on_this_host_is_taken_at_once(tmp_path):
  """kill -9 leaves the lease behind; its process id no longer runs, so the relaunch
  takes it without waiting for it to expire."""
  code = ("import os, signal, sys; from transformer_jax.training import workdir_lock; "
          "workdir_lock.Lease(sys.argv[1]).acquire(); os.kill(os.getpid(), signal.SIGKILL)")
  proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT)
  assert proc.returncode == -signal.SIGKILL
  assert _lease_of(tmp_path)["pid"] != os.getpid()  # The killed process's.
  start = time.time()
  lease = workdir_lock.Lease(tmp_path).acquire()
  assert time.time() - start < workdir_lock.EXPIRES_S / 2
  assert _lease_of(tmp_path)["pid"] == os.getpid()
  lease.release()


def test_a_reused_process_id_does_not_keep_a_dead_holders_lease(tmp_path):
  """The holder's pid runs again, but as another process (another start time)."""
  _write_lease(tmp_path, host=workdir_lock.socket.gethostname(), pid=os.getpid(),
               process_start="1")
  workdir_lock.Lease(tmp_path).acquire().release()


@pytest.mark.parametrize("clock_behind, moving, taken", [
    (2.0, False, True),    # Stopped long ago (a preempted VM): taken once it expires.
    (0.0, False, True),    # Fresh, but it never moves again: taken once it expires.
    (0.0, True, False),    # Fresh and moving: that host's run lives; refused.
    (300.0, True, False),  # Its clock 5 minutes behind ours, moving: it lives; refused.
    (-300.0, False, True),  # Its clock 5 minutes ahead, stopped: taken once it expires.
])
def test_a_lease_from_another_host_is_taken_only_once_its_heartbeat_stops(
    tmp_path, quick, clock_behind, moving, taken):
  """Only whether the holder's heartbeat moves, watched on this host's clock, decides:
  never the age of its time stamp, which another host's clock wrote."""
  beats = iter(range(1_000_000))
  write = lambda: _write_lease(tmp_path, heartbeat=time.time() - clock_behind,
                               beats=next(beats))
  write()
  stop = threading.Event()
  def beat():  # The other host's holder, renewing its lease.
    while not stop.wait(0.1):
      write()
  if moving:
    threading.Thread(target=beat, daemon=True).start()
  try:
    if taken:
      lease = workdir_lock.Lease(tmp_path).acquire()
      assert _lease_of(tmp_path)["token"] == lease.record["token"]
      lease.release()
    else:
      with pytest.raises(workdir_lock.Busy, match="in use by process 1 on host elsewhere"):
        workdir_lock.Lease(tmp_path).acquire()
  finally:
    stop.set()


def test_a_damaged_lease_is_taken_over(tmp_path):
  (tmp_path / workdir_lock.NAME).write_text('{"host": "vm", "pi')
  workdir_lock.Lease(tmp_path).acquire().release()


def test_a_holder_whose_lease_was_taken_stops_before_writing_more(tmp_path, quick):
  lease = workdir_lock.Lease(tmp_path).acquire()
  _write_lease(tmp_path)  # Another host took it while this one's heartbeat had stopped.
  time.sleep(0.5)
  with pytest.raises(workdir_lock.Lost, match="process 1 on host elsewhere"):
    lease.check()
  lease.release()
  assert _lease_of(tmp_path)["token"] == "theirs"  # Its release leaves theirs alone.


def test_a_lease_removed_by_hand_is_taken_back_by_its_holder(tmp_path, quick):
  lease = workdir_lock.Lease(tmp_path).acquire()
  (tmp_path / workdir_lock.NAME).unlink()
  time.sleep(0.5)
  lease.check()
  assert _lease_of(tmp_path)["token"] == lease.record["token"]
  lease.release()


def test_a_run_started_while_another_holds_the_workdir_exits_2_and_touches_nothing(
    tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text("{}")  # Whatever the holder has written.
  with workdir_lock.held(workdir):
    before = {p.name: p.read_bytes() for p in workdir.iterdir()}
    [(code, err)] = run_commands([["--config=configs/transformer.py:numbers,smoke",
                                   f"--workdir={workdir}"]], tmp_path)
    assert_one_line_error(code, err, f"{workdir} is in use by process {os.getpid()} on host")
    assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before
