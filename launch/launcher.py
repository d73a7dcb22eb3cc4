"""Turn an experiment's trials into runs: locally or as a SLURM array job (TPUs: tpu.py).

Each trial trains in ROOT/EXPERIMENT/TRIAL (named from its overrides; --smoke trials in
ROOT/EXPERIMENT_smoke/TRIAL, never beside full ones), where the run saves its resolved
config; a trial whose workdir has results.json is finished and is skipped, and an
unfinished one resumes from its latest checkpoint. ROOT may be local or gs://.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

from absl import flags
from etils import epath
from ml_collections import config_flags

from launch import pack as pack_lib
from launch.sweep import Experiment, Trial, format_value
from transformer_jax import cli, config as config_lib, files
from transformer_jax.data import corpora
from transformer_jax.training import workdir_lock


@dataclasses.dataclass(frozen=True)
class Run:
  trial: Trial
  workdir: str
  args: tuple[str, ...]  # After "python -m transformer_jax.main".


def experiment_dir(experiment: Experiment, root: str, smoke: bool = False) -> epath.Path:
  return epath.Path(root) / (experiment.name + ("_smoke" if smoke else ""))


def plan(experiment: Experiment, root: str, extra: Sequence[tuple[str, str]] = (),
         smoke: bool = False) -> list[Run]:
  """One Run per trial; `extra` (path, value) overrides apply to all of them."""
  config = experiment.config + (",smoke" if smoke else "")
  runs = []
  for trial in experiment.trials:
    workdir = str(experiment_dir(experiment, root, smoke) / trial.name)
    args = (f"--config={config}", f"--workdir={workdir}", *trial.flags,
            *(f"--config.{path}={value}" for path, value in extra))
    runs.append(Run(trial, workdir, args))
  return runs


def check_overrides(runs: Sequence[Run]) -> None:
  """Every trial's config with its overrides applied and checked, as main would, before
  anything is launched: the first mistake (a misspelt field, a bad value) stops the
  launch in one line that names the trial, the field and what would be valid."""
  for run in runs:
    _, error = parse(run)
    if error:
      cli.fail(f"trial {run.trial.name}: {error}")


def parse(run: Run):
  """(the run's parsed config, None), or (None, the first mistake in one line)."""
  argv = ["main", *(a for a in run.args if a.startswith("--config"))]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                  lock_config=True, sys_argv=argv)
  _, error = cli.parse_into(values, argv)
  if error is not None:
    return None, error
  try:
    return config_lib.parse(values.config), None
  except ValueError as e:
    return None, str(e)


def finished(run: Run) -> bool:
  """True once the run wrote results.json (local paths or gs:// alike). A remote path
  that cannot be checked from here counts as unfinished: the run itself resumes."""
  try:
    return epath.Path(run.workdir, "results.json").exists()
  except Exception as e:  # No credentials or network for a gs:// root.
    print(f"# cannot check {run.workdir} from here ({type(e).__name__}); "
          "treating it as unfinished", file=sys.stderr)
    return False


def record(run: Run, experiment: Experiment, code: dict) -> None:
  """WORKDIR/trial.json: the trial, its command line and its code (fingerprint,
  revision and diff; see launch/pack.py)."""
  files.write_atomic(epath.Path(run.workdir) / "trial.json", json.dumps(
      {"experiment": experiment.name, "trial": run.trial.name,
       "overrides": {k: format_value(v) for k, v in run.trial.overrides},
       "args": list(run.args), "code": code}, indent=2))


def recorded_code(run: Run) -> str | None:
  """The code fingerprint the trial was last launched with, if any."""
  try:
    path = epath.Path(run.workdir) / "trial.json"
    return json.loads(path.read_text()).get("code", {}).get("fingerprint") \
        if path.exists() else None
  except Exception:  # An unreadable remote root: the runs check their own code.
    return None


def check_code(runs: Sequence[Run], fingerprint: str, allow_change: bool) -> None:
  """Refuses to resume unfinished trials that were launched with other code."""
  changed = [(r.trial.name, old) for r in runs if not finished(r)
             for old in [recorded_code(r)] if old and old != fingerprint]
  if changed and not allow_change:
    cli.fail(f"the code changed since these trials were launched: "
             f"{', '.join(f'{n} (was {old})' for n, old in changed)}; it is {fingerprint} "
             "now. Pass --allow_code_change to resume them with this code, or launch to "
             "a new --root.")


def shared_data(runs: Sequence[Run], root: str) -> list[Run]:
  """`runs`, each on several machines, reading its prepared data from where every
  process reads it: a TFDS dataset from ROOT/tensorflow_datasets unless
  data.tfds_data_dir names a place (TFDS's default, ~/tensorflow_datasets, is each
  machine's own), and with a bucket for ROOT the tokenized split from ROOT/tokenized
  unless data.cache_dir names one (else each host would tokenize its own)."""
  shared, remote = [], files.is_remote(root)
  root = epath.Path(root if remote else os.path.abspath(root))  # (A job has its own cwd.)
  for run in runs:
    config, _ = parse(run)  # None: a search's dry run shows VALUE for its values.
    if config is None:
      shared.append(run)
      continue
    data = config.data
    extra = [f"--config.data.tfds_data_dir={root / 'tensorflow_datasets'}"
             ] * (corpora.reads_tfds(data) and not data.tfds_data_dir)
    extra += [f"--config.data.cache_dir={root / 'tokenized'}"] * (remote and not data.cache_dir)
    shared.append(dataclasses.replace(run, args=(*run.args, *extra)))
  return shared


def prepare_command(run: Run) -> list[str]:
  """The command that prepares a trial's data once, in one process, before the processes
  that train it start (they build nothing: transformer_jax/data/tasks.py)."""
  return [sys.executable, "-m", "transformer_jax.main", *run.args, "--prepare_data"]


def require(tool: str, target: str) -> None:
  if shutil.which(tool) is None:
    cli.fail(f"--target={target} needs `{tool}` on PATH, and it is not here. Run on a "
             "machine that has it, or add --dry_run to see what would be run.")


# --- local -----------------------------------------------------------------------------

def local_commands(run: Run, processes: int = 1) -> list[list[str]]:
  """The command line(s) for one trial; several for a multi-process trial."""
  base = [sys.executable, "-m", "transformer_jax.main", *run.args]
  if processes == 1:
    return [base]
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  return [base + [f"--coordinator_address=localhost:{port}", f"--num_processes={processes}",
                  f"--process_id={i}"] for i in range(processes)]


# How often a launcher looks again at the trials another launcher is training.
ELSEWHERE_POLL_S = 10.0


def launch_local(experiment: Experiment, runs: Sequence[Run], processes: int,
                 dry_run: bool, code: dict, prepare: bool = True) -> int:
  """Runs the unfinished trials one after another, then waits for those another
  launcher was training (resuming here any that stop unfinished there); returns how
  many failed. A trial of several processes has its data prepared first (`prepare`)."""
  failures, elsewhere = 0, []
  for run in runs:
    if finished(run):
      print(f"# {run.trial.name}: finished, skipped ({run.workdir}/results.json)")
      continue
    commands = local_commands(run, processes)
    for command in [prepare_command(run)] * (prepare and processes > 1) + commands:
      print(shlex.join(command))
    if dry_run:
      continue
    outcome = run_trial(run, experiment, code, commands, prepare=prepare)
    failures += outcome == "failed"
    if outcome == "elsewhere":
      elsewhere.append(run)
  while elsewhere:  # Every trial done before this launcher ends: theirs too.
    time.sleep(ELSEWHERE_POLL_S)
    for run in list(elsewhere):
      if finished(run):
        print(f"# {run.trial.name}: finished elsewhere ({run.workdir}/results.json)")
        elsewhere.remove(run)
      elif workdir_lock.live_holder(run.workdir) is None:
        print(f"# {run.trial.name}: stopped elsewhere, unfinished: resuming it here")
        outcome = run_trial(run, experiment, code, local_commands(run, processes),
                            prepare=prepare)
        failures += outcome == "failed"
        if outcome != "elsewhere":
          elsewhere.remove(run)
  return failures


def run_trial(run: Run, experiment: Experiment, code: dict, commands: Sequence[list[str]],
              watch: Callable[[], bool] | None = None, watch_every_s: float = 5.0,
              prepare: bool = True) -> str:
  """Runs one trial here: "done", "failed", "stopped" (`watch`, called every
  `watch_every_s` while it trains, said stop: it got SIGTERM and checkpointed), or
  "elsewhere" when another launcher's process holds its workdir (it is training it:
  reported with its host and pid, not as a failure). A trial of several processes has
  its data prepared first, in one process (unless not `prepare`)."""
  holder = workdir_lock.live_holder(run.workdir)
  if holder is None:
    record(run, experiment, code)
    try:
      codes = (_run_together([prepare_command(run)], local_log(run))[0]
               if prepare and len(commands) > 1 else [])
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
    if holder is None and cli.EXIT_INPUT in codes and finished(run):
      return "elsewhere"  # Another launcher's, which held it and finished meanwhile.
    if holder is None:
      print(f"# {run.trial.name}: failed (exit codes {codes}); its log: "
            f"{local_log(run)}", file=sys.stderr)
      return "failed"
  print(f"# {run.trial.name}: running elsewhere ({workdir_lock.describe(holder)}); this "
        "launcher waits for it after its own trials")
  return "elsewhere"


def local_log(run: Run) -> str:
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
          procs.append(subprocess.Popen(c, stdout=subprocess.PIPE if i == 0 else log,
                                        stderr=subprocess.STDOUT, text=True))
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


# --- SLURM -----------------------------------------------------------------------------

def slurm_script(experiment: Experiment, runs: Sequence[Run], nodes: int,
                 gpus_per_node: int, code_dir: str, activate: str | None,
                 sbatch: Sequence[str] = (), max_running: int = 0,
                 prepare: bool = True) -> str:
  """An sbatch array script: array task i runs the i-th unfinished trial, one process
  per GPU, with the code in `code_dir` (the unpacked pack, on the shared filesystem)
  after the `activate` shell line; jax.distributed reads its settings from SLURM.
  `sbatch`: more sbatch options (--partition=..., --account=...); `max_running`: at most
  this many array tasks at once (0: no limit). With `prepare`, the batch shell (on the
  first node) prepares the trial's data first, in one process on the CPU, so that the
  processes srun starts build nothing.

  A long run spans many allocations: SLURM signals the batch shell 5 minutes before the
  time limit (--signal=B:USR1@300); the trap passes SIGTERM to the run, which
  checkpoints and exits 75, and the task requeues itself. A preempted task gets SIGTERM
  from SLURM and is requeued by it (--requeue). The next allocation, on as many nodes
  as SLURM gives it, resumes with the same code.
  """
  lines = sbatch_header(experiment.name, len(runs), nodes, gpus_per_node, gpus_per_node,
                        epath.Path(runs[0].workdir).parent, sbatch, max_running)
  lines += ["set -euo pipefail", *[activate] * bool(activate),
            f"cd {shlex.quote(code_dir)}", "export PYTHONPATH=\"$PWD\"",
            'case "$SLURM_ARRAY_TASK_ID" in']
  for i, run in enumerate(runs):
    lines.append(f"  {i}) ARGS=({shlex.join(run.args)}) ;;  # {run.trial.name}")
  lines += ["esac",
            'WORKDIR="$(printf "%s\\n" "${ARGS[@]}" | sed -n "s/^--workdir=//p")"',
            '[ -f "$WORKDIR/results.json" ] && { echo "finished: $WORKDIR"; exit 0; }',
            *['JAX_PLATFORMS=cpu python -m transformer_jax.main "${ARGS[@]}" --prepare_data'
              ] * prepare,
            *run_and_requeue('srun python -m transformer_jax.main "${ARGS[@]}"')]
  return "\n".join(lines) + "\n"


def sbatch_header(name: str, tasks: int, nodes: int, tasks_per_node: int, gpus_per_node: int,
                  folder: epath.Path, sbatch: Sequence[str], max_running: int) -> list[str]:
  """An array job's #SBATCH lines: `tasks` array tasks (at most `max_running` at once;
  0: no limit), output appended to FOLDER/slurm-JOB_TASK.out, requeued after a
  preemption, signalled 5 minutes before the time limit; then `sbatch` options."""
  return ["#!/bin/bash", f"#SBATCH --job-name={name}",
          f"#SBATCH --array=0-{tasks - 1}" + f"%{max_running}" * bool(max_running),
          f"#SBATCH --nodes={nodes}", f"#SBATCH --ntasks-per-node={tasks_per_node}",
          f"#SBATCH --gpus-per-node={gpus_per_node}",
          f"#SBATCH --output={folder / 'slurm-%A_%a.out'}",
          "#SBATCH --open-mode=append", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300",
          *(f"#SBATCH {option}" for option in sbatch)]


def run_and_requeue(command: str) -> list[str]:
  """Shell lines that run `command` so that SLURM's USR1 reaches it as SIGTERM, and
  requeue the task when it exits 75 (checkpointed)."""
  return ["trap 'kill -TERM \"$RUN\" 2>/dev/null' USR1",
          f"{command} & RUN=$!",
          # The trap interrupts `wait`; wait again until the run has really exited.
          'while kill -0 "$RUN" 2>/dev/null; do wait "$RUN" || true; done',
          'CODE=0; wait "$RUN" || CODE=$?',
          f'if [ "$CODE" -eq {cli.EXIT_PREEMPTED} ]; then',
          '  echo "checkpointed before the time limit or preemption: requeueing"',
          '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
          'fi',
          'exit "$CODE"']


def launch_slurm(experiment, runs, dry_run, pack, root, repo_dir, **options) -> str:
  """Unpacks the code beside the runs (EXPERIMENT/code/FINGERPRINT) and submits."""
  todo = [r for r in runs if not finished(r)]
  if not todo:
    return "# every trial is finished"
  if pack and files.is_remote(root):
    cli.fail(f"--root={root}: SLURM runs need a shared filesystem path that every node "
             "mounts (the code is unpacked there), not a bucket.")
  folder = epath.Path(todo[0].workdir).parent
  code_dir = code_folder(folder, pack, repo_dir)
  script = slurm_script(experiment, todo, code_dir=code_dir, **options)
  if not dry_run:
    for run in todo:
      record(run, experiment, pack.record() if pack else {"repo_dir": repo_dir})
  return submit(script, folder, pack, code_dir, dry_run)


def code_folder(folder: epath.Path, pack, repo_dir: str | None) -> str:
  """Where an array job's tasks run the code: the shipped pack, unpacked beside the
  runs (FOLDER/code/FINGERPRINT), or --repo_dir."""
  return str(folder / "code" / pack.fingerprint) if pack else repo_dir


def submit(script: str, folder: epath.Path, pack, code_dir: str, dry_run: bool,
           env: dict | None = None) -> str:
  """Unpacks the code into `code_dir` (if shipped), writes FOLDER/sbatch.sh and submits
  it (sbatch in `env`, passed on to the tasks); a dry run says what it would do."""
  path = str(folder / "sbatch.sh")
  if dry_run:
    return script + (f"# would unpack the code ({len(pack.files)} files) into {code_dir}\n"
                     if pack else "") + f"# would run: sbatch {path}"
  if pack:
    pack_lib.unpack(pack, code_dir)
  files.write_atomic(path, script)
  result = subprocess.run(["sbatch", path], capture_output=True, text=True, env=env)
  if result.returncode:  # (A stand-in that runs the job says the job's error.)
    cli.fail(f"sbatch {path} failed: {result.stderr.strip()}", result.returncode)
  return result.stdout.strip()
