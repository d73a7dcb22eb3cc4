"""Files that many processes write at once (transformer_jax/files.py): appended
records are never lost, replaced files are always whole; stops held over an import
(transformer_jax/stop_policy.py)."""

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
from transformer_jax import stop_policy
def stop(signum, frame):
  raise KeyboardInterrupt(signum)
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
events = []
try:
  with stop_policy.stops_held():
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
  """stop_policy.stops_held (around imports of native libraries, whose initialisation a
  signal's exception aborts): SIGINT in the block is held until it ends, then raised
  once; a SIGTERM ignored stays ignored; the handlers are the same after."""
  out = subprocess.run([sys.executable, "-c", HELD], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == (f"['block ended', 'stopped by {int(signal.SIGINT)} after "
                                "the block'] True True")


def test_gs_paths_need_application_default_credentials_where_google_auth_finds_them(
    tmp_path, monkeypatch):
  """Python's gs:// access (tf.io.gfile, gcsfs) finds application-default credentials
  where google.auth.default looks: a key file, gcloud's file, or a Google Cloud VM's
  metadata server (a TPU VM's). Each suffices; without any, one line that says
  `gcloud auth application-default login`; paths that are not gs:// need none."""
  import http.server
  import socket
  import threading
  from transformer_jax import files

  class Metadata(http.server.BaseHTTPRequestHandler):  # As a TPU VM's server answers.
    def do_GET(self):
      self.send_response(200)
      self.send_header("Metadata-Flavor", "Google")
      self.end_headers()

    def log_message(self, *args):
      pass

  server = http.server.HTTPServer(("127.0.0.1", 0), Metadata)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  with socket.socket() as closed:  # A port nothing listens on: no metadata server.
    closed.bind(("127.0.0.1", 0))
    nothing = f"127.0.0.1:{closed.getsockname()[1]}"
  for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "NO_GCE_CHECK"):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.setenv("GCE_METADATA_IP", nothing)
  product = tmp_path / "product_name"
  monkeypatch.setattr(files, "DMI_PRODUCT_NAME", str(product))
  missing = lambda: files.missing_credentials("gs://bucket/runs")

  why = missing()
  assert "`gcloud auth application-default login`" in why and len(why.splitlines()) == 1
  assert files.missing_credentials(tmp_path / "runs") is None
  assert files.missing_credentials("ram://bucket/runs") is None
  well_known = tmp_path / ".config" / "gcloud" / "application_default_credentials.json"
  well_known.parent.mkdir(parents=True)
  well_known.write_text("{}")
  assert missing() is None
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "elsewhere"))  # gcloud's, moved.
  assert missing() == why
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(well_known.parent))
  assert missing() is None
  monkeypatch.delenv("CLOUDSDK_CONFIG")
  well_known.unlink()
  monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
  assert "GOOGLE_APPLICATION_CREDENTIALS=" in missing()  # Named, but not there.
  (tmp_path / "key.json").write_text("{}")
  assert missing() is None
  monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
  product.write_text("Google Compute Engine\n")  # A Google Cloud VM, by its DMI name.
  assert missing() is None
  product.write_text("Standard PC (Q35 + ICH9, 2009)\n")
  assert missing() == why
  monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{server.server_address[1]}")
  assert missing() is None  # A metadata server answers, as on a TPU VM.
  monkeypatch.setenv("NO_GCE_CHECK", "True")
  assert missing() == why
  server.shutdown()
