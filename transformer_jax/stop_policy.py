"""When a stop (SIGINT, SIGTERM) may act in a command, process-wide: before its outputs,
never between them, and never inside a native library's import.

A command that `cli.run` starts with `stopped` turns a signal into `cli.Stopped`, and
declares (`outputs_end_stops`) that from its first output on it finishes instead: the
file operations that put outputs in place (files.put_in_place, files.replace_dir) and
a command that writes several (`outputs_begin`) then ignore both signals, so what the
command says of its outputs on a stop stays true. Imports of native libraries hold a
stop until they end (`stops_held`). The policy is one flag for the whole process, set
once by the command's entry point, so the code that writes files needs no argument
for it. (Training's stops, a checkpoint and then `Preempted`, are
training/preemption.py's.)
"""

from __future__ import annotations

import contextlib
import signal
import threading

# Set by a command that ends by putting its outputs in place (cli.run): see outputs_end_stops.
_OUTPUTS_END_STOPS = threading.Event()


def outputs_end_stops() -> None:
  """From the moment this process starts putting its outputs in place (replace_dir,
  put_in_place, outputs_begin), SIGINT and SIGTERM are ignored: a stop then comes
  before any output is written, never between an output and the next or its report,
  and what the command says of its outputs on a stop stays true. (Files written into
  a staging folder first are not outputs yet.)"""
  _OUTPUTS_END_STOPS.set()


def outputs_begin() -> None:
  """The command puts its outputs in place from here (see outputs_end_stops)."""
  if _OUTPUTS_END_STOPS.is_set() and threading.current_thread() is threading.main_thread():
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def stops_held():
  """SIGINT and SIGTERM wait until the block ends, then act as they would have. For
  imports of native libraries (PyTorch, transformers, CTranslate2, TensorFlow): an
  exception raised inside their initialisation aborts the process (pybind11's
  terminate) or turns into an ImportError ("initialization failed") that would read as
  "not installed"."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  held = []
  handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
  for signum, handler in handlers.items():
    if callable(handler):
      signal.signal(signum, lambda signum, frame: held.append(signum))
  try:
    yield
  finally:
    for signum, handler in handlers.items():
      if callable(handler):
        signal.signal(signum, handler)
    for signum in dict.fromkeys(held):
      signal.raise_signal(signum)
