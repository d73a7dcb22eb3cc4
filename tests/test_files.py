"""Files that many processes write at once (transformer_jax/files.py): appended
records are never lost, replaced files are always whole; stops held over an import."""

import json
import os
import signal
import subprocess
import sys

from conftest import ROOT

WRITER = """
import json, sys
from transformer_jax import files
path, who, count, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for i in range(count):
  record = json.dumps({"writer": who, "line": i, "pad": "x" * 200})
  if mode == "append":
    files.append_line(path, record)
  else:
    files.write_atomic(path, record + "\\n")
"""


def _writers(path, mode: str, processes: int = 6, count: int = 150) -> None:
  procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(who), str(count),
                             mode], cwd=ROOT, stderr=subprocess.PIPE, text=True)
           for who in range(processes)]
  for proc in procs:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]


def test_processes_appending_at_once_lose_no_line(tmp_path):
  """results.jsonl's writer: six processes, 150 records each, at once: all 900 are
  there, each whole, each once, and every writer's in its own order."""
  path = tmp_path / "results.jsonl"
  _writers(path, "append")
  records = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(records) == 900
  assert {(r["writer"], r["line"]) for r in records} == {(w, i) for w in range(6)
                                                         for i in range(150)}
  for writer in range(6):
    assert [r["line"] for r in records if r["writer"] == writer] == list(range(150))


def test_processes_replacing_one_file_at_once_leave_it_whole(tmp_path):
  """Each write has its own temporary name: six processes replacing one file 150
  times each never fail on another's temporary file, the file is one whole record,
  and no temporary file is left."""
  path = tmp_path / "best.json"
  _writers(path, "replace")
  record = json.loads(path.read_text())
  assert record["line"] == 149 and 0 <= record["writer"] < 6
  assert os.listdir(tmp_path) == ["best.json"]


HELD = """
import signal
from transformer_jax import files
def stop(signum, frame):
  raise KeyboardInterrupt(signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
events = []
try:
  with files.stops_held():
    signal.raise_signal(signal.SIGINT)
    signal.raise_signal(signal.SIGTERM)
    signal.raise_signal(signal.SIGINT)
    events.append("block ended")
  events.append("went on")
except KeyboardInterrupt as e:
  events.append(f"stopped by {e.args[0]} after the block")
handlers = signal.getsignal(signal.SIGINT) is stop, signal.getsignal(signal.SIGTERM)
print(events, handlers[0], handlers[1] is signal.SIG_IGN)
"""


def test_a_stop_during_a_held_import_acts_once_when_it_ends():
  """files.stops_held (around imports of native libraries, whose initialisation a
  signal's exception aborts): SIGINT in the block is held until it ends, then raised
  once; a SIGTERM ignored stays ignored; the handlers are the same after."""
  out = subprocess.run([sys.executable, "-c", HELD], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == (f"['block ended', 'stopped by {int(signal.SIGINT)} after "
                                "the block'] True True")
