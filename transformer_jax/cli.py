"""What every command line shares: flag parsing with one-line errors, and exit codes.

Exit codes of every command (main, translate, evaluate, benchmark, launch, launch.results):
  0  done
  1  an unexpected failure (with a traceback: please report it)
  2  bad input: a config field, flag, file or experiment, or a workdir that another run
     is writing; one line on stderr naming it, nothing in the workdir created or changed
  3  training stopped on non-finite loss or gradients (train.on_nonfinite)
  74 no space left to save a checkpoint: free some, run the same command to resume
  75 stopped by SIGINT (Ctrl-C), SIGTERM or a preemption notice: training after
     checkpointing the step in flight (run the same command to resume); translate,
     evaluate, score, export and import_model before they finished, one line saying so,
     every output they write left as it was (each is written whole or not at all)

The TPU launcher's watcher exits 1 when a trial gave up and 130 after Ctrl-C.

Logs: a command prints this project's own log lines and every library's errors; pass
--verbosity (absl's: 0 information, 1 debugging) to see every library's log lines at
that level too; --verbosity=-1 (warnings) keeps only this project's warnings and every
library's errors.

Compiled programs are kept between runs (transformer_jax/compile_cache.py):
--compilation_cache=DIR moves the cache, --compilation_cache=off turns it off.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import inspect
import logging
import os
import pathlib
import re
import signal
import sys
import threading
import warnings
from typing import Callable, NoReturn, Sequence

from absl import app, flags
from absl import logging as absl_logging

from transformer_jax import compile_cache, files, stop_policy

EXIT_INPUT, EXIT_NONFINITE, EXIT_DISK_FULL, EXIT_PREEMPTED = 2, 3, 74, 75
# This project's code: its log lines are always shown (see quiet_libraries).
_OURS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           package) + os.sep for package in ("transformer_jax", "launch"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ notices, if loaded.


flags.DEFINE_string(
    "compilation_cache", None, "Where compiled programs are kept between runs (JAX's "
    "persistent compilation cache), or 'off'. Default: $JAX_COMPILATION_CACHE_DIR, else "
    f"{compile_cache.default_directory()}; at most {compile_cache.MAX_BYTES >> 30} GiB.")


def fail(message: str, code: int = EXIT_INPUT) -> NoReturn:
  if not _SIGNALLED:  # After a stop, an error is the stop's doing: cli.run says so.
    print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


class Stopped(KeyboardInterrupt):
  """SIGINT (Ctrl-C) or SIGTERM while a command works, raised in its main thread. A
  KeyboardInterrupt, so that what handles Ctrl-C handles SIGTERM alike."""

  def __init__(self, signum: int):
    super().__init__(signal_name(signum))
    self.signum = signum
    self.note = ""  # What the stop left, where the command knows better than cli.run.


def signal_name(signum: int) -> str:
  name = signal.Signals(signum).name
  return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


# The stops cli.run's handlers raised in this process. A library may catch one and raise
# an error of its own (pybind11's "initialization failed" ImportError, JAX's pytree
# "Exception raised while checking equality of metadata fields"): the command still ends
# as stopped.
_SIGNALLED: list[Stopped] = []


def _raise_stopped(signum, frame):
  _SIGNALLED.append(Stopped(signum))
  raise _SIGNALLED[-1]


def _exit_now(code: int) -> NoReturn:
  """Ends the process with `code` once its output is flushed, without the interpreter's
  teardown: reads and threads still pending in JAX, TensorStore or Orbax would print
  their errors as they are dropped, or crash the runtime as it shuts down."""
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  logging.shutdown()
  os._exit(code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every mistake (unknown flag, bad value, unknown or
  misspelt config field, missing config file, unknown config name, a gs:// path with no
  filesystem package installed or, but for a dry run or --print_config, no credentials)
  answered in one line instead of a traceback or a page of usage. --help (-h) and
  --helpfull print the usage and exit 0."""
  for arg in argv[1:]:
    if arg in ("--help", "-h", "--helpshort", "-?", "--helpfull"):
      app.usage(shorthelp=arg != "--helpfull", writeto_stdout=True, exitcode=0)
  _config_file_here(argv)
  rest, error = parse_into(flags.FLAGS, argv)
  if error:
    fail(error)
  # A dry run or a printed config reads no bucket, so it asks for no credentials.
  reading = not any(flags.FLAGS[name].value for name in ("dry_run", "print_config")
                    if name in flags.FLAGS)
  for name in list(flags.FLAGS):  # Importing a filesystem may define more flags.
    value = flags.FLAGS[name].value
    if isinstance(value, str) and (why := files.missing_filesystem(value) or (
        reading and files.missing_credentials(value))):
      fail(f"--{name}={value}: {why}")
  return rest


def _config_file_here(argv: list[str]) -> None:
  """A --config file that is not where the command runs, but is in this repository
  (configs/transformer.py from another folder): one line saying where it is."""
  repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for arg in argv[1:]:
    if arg.startswith("--config="):
      path = arg.removeprefix("--config=").split(":", 1)[0]
      there = os.path.join(repository, path)
      if not os.path.isabs(path) and not os.path.exists(path) and os.path.exists(there):
        fail(f"--config={path}: no such file in {os.getcwd()}; this repository's is "
             f"{there}: run from {repository}, or give that path.")


def parse_into(values: flags.FlagValues, argv: list[str]) -> tuple[list[str], str | None]:
  """Parses `argv` into `values` (a config file's fields included): the arguments left,
  and the first mistake in one line (None when there is none)."""
  try:
    rest = values(argv)
    if "config" in values and values["config"].present:
      list(values.config.keys())  # ml_collections loads the file lazily: now.
  except Exception as e:  # absl and ml_collections raise several types for these.
    cause = e  # The first error in the chain that is not absl's wrapper says most.
    while isinstance(cause, flags.Error) and "Traceback" in str(cause) and (
        cause.__cause__ or cause.__context__) is not None:
      cause = cause.__cause__ or cause.__context__
    text = cause.args[0] if isinstance(cause, (KeyError, AttributeError)) and cause.args \
        else str(cause)
    text = str(text)
    if "Traceback (most recent call last)" in text:  # A config file's own error, as text.
      text = re.sub(r"^\w+(Error|Exception): ", "", text.strip().splitlines()[-1].strip())
    text = text.replace("\\n", " ").replace("\\", "").replace("'", "")
    return [], _name_the_field(" ".join(text.split()), argv) or type(cause).__name__
  return rest, None


def _name_the_field(message: str, argv: list[str]) -> str:
  """ml_collections names only the last part of a misspelt field ("num_head Did you
  mean ..."); this puts the flag that holds it in front (--config.model.num_head)."""
  first = message.split(" ", 1)[0]
  for arg in argv[1:]:
    name = arg.split("=", 1)[0]
    if name.startswith("--") and first in name.lstrip("-").split(".")[1:]:
      return f"{name}: {message}"
  return message


def quiet_libraries() -> None:
  """Unless --verbosity=0 or more was given: drops libraries' log lines below ERROR (JAX's
  backend probing, Orbax's narration of each save and restore) and asyncio's, and
  shortens their errors to one line, without the traceback (Orbax's writer threads log
  one per array when a disk fills up; the run then fails with one error that names it).
  --verbosity=-1 (warnings only) keeps them dropped."""
  verbosity = flags.FLAGS["verbosity"] if "verbosity" in flags.FLAGS else None
  if verbosity is not None and verbosity.present and verbosity.value >= 0:
    return
  absl_logging.get_absl_handler().addFilter(_quiet)
  sys.unraisablehook = _without_dropped_reads(sys.unraisablehook)
  warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)


def _without_dropped_reads(hook):
  """A damaged checkpoint's reads fail in Orbax's coroutines, some after its event loop
  has closed, some never started; Python prints each one's traceback (hundreds of
  lines) or a warning as it drops the coroutine, whenever that is: before the command's
  own error line or after it. The failure itself is reported once, by whoever read the
  checkpoint."""
  def unraisable(info):
    closed_loop = isinstance(info.exc_value, RuntimeError) and \
        str(info.exc_value) == "Event loop is closed"
    if not (inspect.iscoroutine(info.object) or closed_loop):
      hook(info)
  return unraisable


def _quiet(record: logging.LogRecord) -> bool:
  if record.pathname.startswith(_OURS):
    return True
  if record.levelno < logging.ERROR or record.name == "asyncio":
    return False
  record.msg, record.args = record.getMessage().splitlines()[0][:300], ()
  record.exc_info = record.exc_text = None
  return True


def cpu_without_accelerators() -> None:
  """JAX_PLATFORMS=cpu on a machine with libtpu installed (to compile for TPU slices) but
  no TPU chips and no NVIDIA GPU, unless JAX_PLATFORMS is set: libtpu would otherwise
  probe for TPUs at every start and print five lines of errors."""
  if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
    return
  tpus = glob.glob("/dev/accel*") or os.path.exists("/dev/vfio") or any(
      pathlib.Path(path).read_text().strip() == "0x1ae0"  # Google's PCI vendor id: TPUs.
      for path in glob.glob("/sys/bus/pci/devices/*/vendor"))
  if not tpus and not glob.glob("/dev/nvidia[0-9]*"):
    os.environ["JAX_PLATFORMS"] = "cpu"  # For the processes this one starts,
    import jax
    jax.config.update("jax_platforms", "cpu")  # and for this one (read at import).


def run(main: Callable[[], int | None], argv: Sequence[str] | None = None,
        stopped: str | None = None, outputs_end_stops: bool = True) -> None:
  """app.run for a `main` without arguments: positional arguments are refused; what
  `main` returns is the exit code (None: 0).

  With `stopped` (when and what a stop leaves, after "stopped by SIGNAL "), SIGINT and
  SIGTERM raise `Stopped` in `main` (a SIGINT ignored at the start, as in a shell's
  background job, stays ignored); one that `main` lets through ends the command with
  that line and exit 75. With `outputs_end_stops` they are ignored once an output is
  put in place (stop_policy.outputs_end_stops): `stopped` then speaks of untouched outputs."""
  def main_with_argv(args):
    if len(args) > 1:
      fail(f"unexpected arguments {' '.join(args[1:])!r}: flags are --name=value "
           "(see --help).")
    quiet_libraries()
    cpu_without_accelerators()
    compile_cache.enable(flags.FLAGS.compilation_cache)
    if stopped is None:
      return _run_main(main)
    handled = [signal.SIGTERM] + [signal.SIGINT] * (signal.getsignal(signal.SIGINT)
                                                     is not signal.SIG_IGN)
    for signum in handled:
      signal.signal(signum, _raise_stopped)
    sys.unraisablehook = _stops_raised_again(sys.unraisablehook)
    if outputs_end_stops:
      stop_policy.outputs_end_stops()
    try:
      code = _run_main(main)
    except Stopped as e:
      _end_stopped(e, stopped)
    except SystemExit as e:
      code = e.code
      if code and _SIGNALLED:  # An error a stop caused (fail() printed nothing).
        _end_stopped(_SIGNALLED[0], stopped)
    except Exception:
      if not _SIGNALLED:
        raise
      _end_stopped(_SIGNALLED[0], stopped)
    for signum in handled:  # The command has ended: a signal during the interpreter's
      signal.signal(signum, signal.SIG_IGN)  # teardown changes nothing, kills nothing.
    return code
  app.run(main_with_argv, argv=argv, flags_parser=parse_flags)


def _end_stopped(stop: Stopped, stopped: str) -> NoReturn:
  print(f"stopped by {stop} {stop.note or stopped}", file=sys.stderr)
  _exit_now(EXIT_PREEMPTED)


def _stops_raised_again(hook):
  """A stop raised where Python drops exceptions (a garbage collector's callback, a
  finalizer) is sent again a moment later, from a thread, to be raised where the
  command can end on it (dropped again, it is sent again)."""
  def unraisable(info):
    if isinstance(info.exc_value, Stopped):
      threading.Timer(0.01, os.kill, (os.getpid(), info.exc_value.signum)).start()
    else:
      hook(info)
  return unraisable


def _run_main(main: Callable[[], int | None]) -> int | None:
  try:
    return main()
  except Exception as e:  # Any command, any file (libraries' errors too: safetensors,
    if not files.out_of_space(e):  # TensorStore): a full disk is one line, exit 74.
      raise
    where = getattr(e, "filename", None)
    detail = e.strerror if where and e.strerror else " ".join(str(e).split())[:200]
    fail(f"no space left on the device of {where or 'an output'} ({detail}): "
         "what was there before is kept (every file is written whole or not at all). "
         "Free space, then run the same command.", EXIT_DISK_FULL)
