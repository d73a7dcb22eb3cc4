"""The local target: trials as processes on this machine, one trial after another (a
trial of several processes, --processes, with a coordinator on localhost).

Two launchers on one root share its trials: each trains those no live process holds
(training/workdir_lock.py), then waits for the others' and resumes here any that stop
unfinished there. Ctrl-C, or SIGTERM to the launcher alone, reaches the trial's
processes, which checkpoint and exit; the same command resumes them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

import jax
from absl import flags

from launch import pack as pack_lib, search as search_lib, study as study_lib, sweep
from launch import trial_lease, trials as trials_lib
from launch.targets import TARGETS, Target
from transformer_jax import cli, files
from transformer_jax.planning import topology
from transformer_jax.training import workdir_lock

# How often a launcher looks again at the trials another launcher is training, unless
# --poll_s.
ELSEWHERE_POLL_S = 10.0


@TARGETS.register("local")
class Local(Target):
  """Trials run here; what each runs is `commands` (a subclass may change it)."""

  @staticmethod
  def define_flags() -> None:
    flags.DEFINE_integer("processes", 1, "local: processes per trial (multi-process runs).")
    flags.DEFINE_bool("srun", False, "local: start each trial's processes with srun, one "
                      "per task of the SLURM allocation this launcher runs in (what a "
                      "SLURM search whose trials span several nodes runs).")

  def hosts(self) -> int:
    return int(os.environ.get("SLURM_NNODES", 1)) if self.flags.srun else 1

  def processes(self) -> int:
    return int(os.environ.get("SLURM_NTASKS", 1)) if self.flags.srun else self.flags.processes

  def devices(self) -> int:
    """The devices of one trial trained here, for a search's device-hours: those
    CUDA_VISIBLE_DEVICES names (SLURM names a node's GPUs; a SLURM search whose trials
    share a node gives each launcher its own), else this machine's GPUs, else 1 (the
    CPU); with --srun, as many on each node of the allocation."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    here = len(visible.split(",")) if visible else len(glob.glob("/dev/nvidia[0-9]*"))
    return max(here, 1) * self.hosts()

  def where(self) -> str:
    """This launcher's machine(s) and devices, as a trial records them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (f"SLURM nodes {os.environ.get('SLURM_JOB_NODELIST', '?')}" if self.flags.srun
            else socket.gethostname()) + f" CUDA_VISIBLE_DEVICES={visible}" * bool(visible)

  def search_code(self) -> str:
    return pack_lib.fingerprint(os.getcwd())  # The code here is what trains, --ship or not.

  def commands(self, run: trials_lib.Run) -> list[list[str]]:
    """The command line(s) of one trial: one per process, with a free port on
    localhost for the coordinator of several."""
    base = [sys.executable, "-m", "transformer_jax.main", *run.args]
    processes = self.processes()
    if self.flags.srun:  # SLURM starts a process per task, each finding JAX's others.
      return [["srun", *base]]
    if processes == 1:
      return [base]
    with socket.socket() as s:
      s.bind(("localhost", 0))
      port = s.getsockname()[1]
    return [base + [f"--coordinator_address=localhost:{port}",
                    f"--num_processes={processes}", f"--process_id={i}"]
            for i in range(processes)]

  def launch(self, experiment: sweep.Experiment, runs: Sequence[trials_lib.Run]) -> int:
    code = pack_lib.describe(os.getcwd())
    trials_lib.check_code(runs, code["fingerprint"], self.flags.allow_code_change)
    failed = self.run_all(experiment, runs, code)
    if self.flags.dry_run:
      self.print_costs(runs, self.flags.cost_on or own_accelerators())
    return 1 if failed else 0

  def run_all(self, experiment: sweep.Experiment, runs: Sequence[trials_lib.Run],
              code: dict) -> int:
    """Runs the unfinished trials one after another, then waits for those another
    launcher was training (resuming here any that stop unfinished there); returns how
    many failed."""
    failures, elsewhere, prepare = 0, [], self.prepare()
    for run in runs:
      if trials_lib.finished(run):
        print(f"# {run.trial.name}: finished, skipped ({run.workdir}/results.json)")
        continue
      commands = self.commands(run)
      for command in [trials_lib.prepare_command(run)] * self.prepare() + commands:
        print(shlex.join(command))
      if self.flags.dry_run:
        continue
      outcome = run_trial(run, experiment, code, commands, prepare=prepare)
      failures += outcome == "failed"
      if outcome == "elsewhere":
        elsewhere.append(run)
    while elsewhere:  # Every trial done before this launcher ends: theirs too.
      time.sleep(self.flags.poll_s or ELSEWHERE_POLL_S)
      for run in list(elsewhere):
        if trials_lib.finished(run):
          print(f"# {run.trial.name}: finished elsewhere ({run.workdir}/results.json)")
          elsewhere.remove(run)
        elif workdir_lock.live_holder(run.workdir) is None:
          print(f"# {run.trial.name}: stopped elsewhere, unfinished: resuming it here")
          outcome = run_trial(run, experiment, code, self.commands(run), prepare=prepare)
          failures += outcome == "failed"
          if outcome != "elsewhere":
            elsewhere.remove(run)
    return failures

  def search(self, experiment: sweep.Experiment, extra, storage: str) -> int:
    """Runs the search here, one trial at a time, until the budget is spent, reading
    each trial's new evaluations every --poll_s; exit 1 if any trial failed for good."""
    flags, code = self.flags, pack_lib.describe(os.getcwd())
    print(search_lib.describe(experiment))
    if flags.dry_run:
      example = search_lib.trial_run(experiment, flags.root, extra, flags.smoke,
                                     search_lib.trial_name(0),
                                     {p: "VALUE" for p in experiment.search.space})
      print("# each trial, its values drawn by the sampler:")
      print(shlex.join(self.commands(example)[0]))
      return 0
    study = study_lib.open_study(experiment, storage)
    seen, failures = trial_lease.Seen(), 0
    while (drawn := search_lib.next_trial(study, experiment.search, seen)) is not None:
      trial, held = drawn
      try:
        failures += self._train(study, trial, experiment, extra, code) == "failed"
      finally:
        held.release()
    done = [t for t in search_lib.counted(study.get_trials(deepcopy=False))
            if t.state.is_finished()]
    print(f"# search done: {len(done)} trials ended; "
          + search_lib.spent(study.get_trials(deepcopy=False), experiment.search))
    search_lib.write_best(study, experiment, flags.root, flags.smoke)
    return 1 if failures else 0

  def _train(self, study, trial, experiment: sweep.Experiment, extra, code: dict) -> str:
    """Trains one trial of a search here, reporting its metric at each evaluation and
    stopping it when the pruner says so; tells the study how it ended."""
    flags = self.flags
    run = search_lib.trial_run(experiment, flags.root, extra, flags.smoke,
                               trial.user_attrs["name"], trial.params,
                               trial.user_attrs.get("workdir"))
    if self.hosts() > 1:  # The nodes read the data prepared once where all read it.
      run = trials_lib.shared_data([run], flags.root)[0]
    reporter = search_lib.Reporter(study, trial, experiment.search, run)
    trials_lib.record(run, experiment, code)
    started, outcome = time.time(), "interrupted"
    try:
      outcome = run_trial(run, experiment, code, self.commands(run), watch=reporter.watch,
                          watch_every_s=flags.poll_s or search_lib.POLL_S,
                          prepare=self.prepare())
    finally:  # Its time counts however it ended, unless another launcher trained it.
      if outcome != "elsewhere":
        search_lib.spend(trial, self.hosts(), self.devices(), time.time() - started,
                         self.where())
    if outcome == "elsewhere":
      return outcome
    return reporter.end(outcome == "done", f"see {local_log(run)}")


def own_accelerators() -> str | None:
  """This machine's GPUs as benchmark --topology names them (8xH100), or None."""
  devices = jax.devices()
  for model, (kind, *_) in topology.GPUS.items():
    if devices[0].device_kind == kind:
      return f"{len(devices)}x{model}"
  print(f"# cost: not estimated for this machine's {len(devices)} {devices[0].device_kind} "
        "device(s); --cost_on=8xH100 (or 16xH200, v5p-64...) estimates it there")
  return None


def run_trial(run: trials_lib.Run, experiment: sweep.Experiment, code: dict, commands: Sequence[list[str]],
              watch: Callable[[], bool] | None = None, watch_every_s: float = 5.0,
              prepare: bool = False) -> str:
  """Runs one trial here: "done", "failed", "stopped" (`watch`, called every
  `watch_every_s` while it trains, said stop: it got SIGTERM and checkpointed), or
  "elsewhere" when another launcher's process holds its workdir (it is training it:
  reported with its host and pid, not as a failure). With `prepare` (a trial of several
  processes) its data is prepared first, in one process."""
  holder = workdir_lock.live_holder(run.workdir)
  if holder is None:
    trials_lib.record(run, experiment, code)
    try:
      codes = (_run_together([trials_lib.prepare_command(run)], local_log(run))[0]
               if prepare else [])
      if not any(codes):
        codes, stopped = _run_together(commands, local_log(run), watch=watch,
                                       watch_every_s=watch_every_s)
        if stopped:
          return "stopped"
    except KeyboardInterrupt:  # The trial got the Ctrl-C (or SIGTERM) too: checkpointed.
      print(f"# {run.trial.name}: interrupted (see {run.workdir}/exit.json); the same "
            "command resumes it and the trials after it.", file=sys.stderr)
      sys.exit(cli.EXIT_PREEMPTED)
    if not any(codes):
      return "done"
    holder = workdir_lock.live_holder(run.workdir) if cli.EXIT_INPUT in codes else None
    if holder is None and cli.EXIT_INPUT in codes and trials_lib.finished(run):
      return "elsewhere"  # Another launcher's, which held it and finished meanwhile.
    if holder is None:
      print(f"# {run.trial.name}: failed (exit codes {codes}); its log: "
            f"{local_log(run)}", file=sys.stderr)
      return "failed"
  print(f"# {run.trial.name}: running elsewhere ({workdir_lock.describe(holder)}); this "
        "launcher waits for it after its own trials")
  return "elsewhere"


def local_log(run: trials_lib.Run) -> str:
  """Where a trial's processes write their output (process 0's also goes to this
  terminal): the workdir's launch.log, or a local file when the workdir is remote."""
  if not files.is_remote(run.workdir):
    return os.path.join(run.workdir, "launch.log")
  return os.path.join(tempfile.gettempdir(), "transformer_jax_launch",
                      run.workdir.split("://", 1)[1].replace("/", "_") + ".log")


def _run_together(commands: Sequence[list[str]], log_path: str, grace_s: float = 60.0,
                  watch: Callable[[], bool] | None = None, watch_every_s: float = 5.0
                  ) -> tuple[list[int], bool]:
  """Runs the processes of one trial; returns their exit codes, and whether `watch`
  stopped them. When one fails, the others would wait for it forever in a collective:
  they get SIGTERM, then SIGKILL after `grace_s`; so do all when `watch` says stop."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  procs: list[subprocess.Popen] = []
  tee = None
  with open(log_path, "a") as log:
    try:
      with _sigterm_passed_on(procs):  # In place before any process starts.
        for i, c in enumerate(commands):
          procs.append(subprocess.Popen(  # Without the study's password.
              c, stdout=subprocess.PIPE if i == 0 else log, stderr=subprocess.STDOUT,
              text=True, env=study_lib.without_secrets(os.environ)))
        tee = threading.Thread(target=_tee, args=(procs[0].stdout, log), daemon=True)
        tee.start()
        looked, stopped = time.time(), False
        while any(p.poll() is None for p in procs):
          if any(p.poll() for p in procs):  # One exited with an error.
            _stop(procs, grace_s)
          if watch and time.time() - looked > watch_every_s:
            looked = time.time()
            if watch():
              stopped = True
              _stop(procs, grace_s)
          time.sleep(0.2)
    finally:  # Ctrl-C reached the processes too: a second signal would lose the
      _wait(procs, grace_s)  # checkpoint they are writing, so first let them exit.
      _stop(procs, grace_s)
      if tee:
        tee.join(timeout=10)
  return [p.wait() for p in procs], stopped


@contextlib.contextmanager
def _sigterm_passed_on(procs: Sequence[subprocess.Popen]):
  """A SIGTERM to the launcher alone (`kill`, a supervisor) reaches the trial's
  processes, which checkpoint and exit, and raises KeyboardInterrupt here as Ctrl-C
  does; without this the trial would go on, orphaned."""
  if threading.current_thread() is not threading.main_thread():  # Python's rule.
    yield
    return

  def pass_on(signum, frame):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)
    raise KeyboardInterrupt
  previous = signal.signal(signal.SIGTERM, pass_on)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _tee(lines, log) -> None:
  """Process 0's output, line by line, to this terminal and to the trial's log."""
  for line in lines:
    sys.stdout.write(line)
    sys.stdout.flush()
    log.write(line)
    log.flush()


def _wait(procs: Sequence[subprocess.Popen], seconds: float) -> None:
  deadline = time.time() + seconds
  while any(p.poll() is None for p in procs) and time.time() < deadline:
    time.sleep(0.2)


def _stop(procs: Sequence[subprocess.Popen], grace_s: float) -> None:
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  _wait(procs, grace_s)
  for p in procs:
    if p.poll() is None:
      p.kill()


