"""Cloud TPU VMs through gcloud, for the TPU target (launch/targets/tpu.py): the commands
that create, describe, reach and delete a TPU, ship the code to every worker and start
a run there, and one look at a trial on a TPU of its own (`look`: create it, start the
run, recreate it after a preemption, copy the workers' logs and delete it once the
trial's results.json exists).

Every step is a gcloud command, printed on --dry_run. The runs resume by themselves: a
recreated TPU starts the same command, which restores the workdir's latest checkpoint.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex
import subprocess
import tempfile
from typing import Callable, Sequence

from etils import epath

from launch import pack as pack_lib, study as study_lib, trials as trials_lib
from transformer_jax import cli
from transformer_jax.planning import topology

CODE_HOME = "transformer_jax_code"  # ~/CODE_HOME/FINGERPRINT on each worker.
LOGS = "transformer_jax_logs"  # ~/LOGS/EXPERIMENT/TRIAL.HOSTNAME.log on each worker.
LOG_LINES = 1000  # Each worker log's last lines, copied to WORKDIR/logs before deletion.
PID = "transformer_jax_run.pid"  # ~/PID: the run a worker is running, if any.
# The worker's virtualenv: from the runtime's python3 if it is 3.11 or newer; else (as on
# tpu-ubuntu2204-base, Python 3.10) from a Python 3.11 that uv downloads.
VENV = ("{ python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' && python3 -m venv "
        ".venv || { pip install -q --user uv && ~/.local/bin/uv venv -q --seed --python 3.11 "
        ".venv; }; }")
PACKS = os.path.join(tempfile.gettempdir(), "transformer_jax_packs")  # Here, to copy.
# TPU VM and queued-resource states: running, gone for good (recreate), or on the way.
READY = {"READY", "ACTIVE"}
LOST = {"PREEMPTED", "TERMINATED", "STOPPED", "SUSPENDING", "SUSPENDED", "FAILED"}


@dataclasses.dataclass(frozen=True)
class Tpu:
  name: str
  zone: str
  project: str | None = None
  accelerator_type: str | None = None  # To create it: v5p-64, v6e-256, ...
  runtime_version: str = "tpu-ubuntu2204-base"
  spot: bool = False
  queued: bool = False  # Created as a queued resource (its node has the same name).

  def gcloud(self, *args: str) -> list[str]:
    return ["gcloud", "compute", "tpus", *args, f"--zone={self.zone}",
            *([f"--project={self.project}"] if self.project else [])]

  def create(self) -> list[str]:
    spec = [f"--accelerator-type={self.accelerator_type}",
            f"--runtime-version={self.runtime_version}", *["--spot"] * self.spot]
    if self.queued:
      return self.gcloud("queued-resources", "create", self.name, f"--node-id={self.name}",
                         *spec)
    return self.gcloud("tpu-vm", "create", self.name, *spec)

  def describe(self) -> list[str]:
    if self.queued:
      return self.gcloud("queued-resources", "describe", self.name, "--format=value(state.state)")
    return self.gcloud("tpu-vm", "describe", self.name, "--format=value(state)")

  def delete(self) -> list[str]:
    if self.queued:
      return self.gcloud("queued-resources", "delete", self.name, "--force", "--quiet")
    return self.gcloud("tpu-vm", "delete", self.name, "--quiet")

  def ssh(self, command: str, worker: str = "all") -> list[str]:
    return self.gcloud("tpu-vm", "ssh", self.name, f"--worker={worker}", f"--command={command}")


def hosts(accelerator_type: str | None) -> int:
  """The hosts of a TPU of this type, each running one process of a run; 2 (several)
  when the type is not given or not known here."""
  try:
    return topology.parse_tpu(accelerator_type).hosts if accelerator_type else 2
  except ValueError:
    return 2


def start_commands(tpu: Tpu, runs: Sequence[trials_lib.Run], pack: pack_lib.Pack | None,
                   pack_dir: str, repo_dir: str | None = None, prepare: bool = False
                   ) -> list[list[str]]:
  """Copy the pack to every worker, unpack it in ~/CODE_HOME/FINGERPRINT and install it
  there once, into a virtualenv `.venv` of a Python the project supports (or, without a
  pack, install the code at `repo_dir`); with `prepare`, prepare each run's data once,
  on worker 0, waiting for it (the workers' processes build nothing); then start the
  runs one after another with that Python, detached from ssh (a dropped connection does
  not stop them) in a process group of their own (~/PID names it). A worker that is
  already running one prepares and starts nothing."""
  install = (f"{{ [ -f .installed ] || {{ {VENV} && .venv/bin/pip install -q -e "
             "'.[tpu,tfds]' && touch .installed; }; }")
  code = _code_dir(pack, repo_dir)
  if pack:
    copy = [tpu.gcloud("tpu-vm", "scp", f"{pack_dir}/{pack.name}", f"{tpu.name}:{pack.name}",
                       "--worker=all")]
    install = (f"mkdir -p {code} && tar -xzf ~/{pack.name} -C {code} && rm ~/{pack.name} "
               f"&& cd {code} && {install}")
  else:
    copy, install = [], f"cd {code} && {install}"
  logs = f"~/{LOGS}/{shlex.quote(epath.Path(runs[0].workdir).parent.name)}"
  trials = "; ".join(
      shlex.join([".venv/bin/python", "-m", "transformer_jax.main", *run.args])
      + f" > {worker_log(run)} 2>&1" for run in runs)
  unless_going = lambda action: (
      f"cd {code} && mkdir -p {logs} && if kill -0 \"$(cat ~/{PID} 2>/dev/null)\" "
      f"2>/dev/null; then echo \"$(hostname): a run is going; starting nothing\"; "
      f"else {action}; fi")
  start = unless_going(f"setsid nohup bash -c {shlex.quote(trials)} > /dev/null 2>&1 "
                       f"< /dev/null & echo $! > ~/{PID}")
  data = " && ".join(shlex.join(["JAX_PLATFORMS=cpu", ".venv/bin/python", "-m",
                                 "transformer_jax.main", *run.args, "--prepare_data"])
                     + f" 2>&1 | tee -a {logs}/{shlex.quote(run.trial.name)}.prepare.log"
                     for run in runs)
  return [*copy, tpu.ssh(install),
          *[tpu.ssh(unless_going(f"set -o pipefail && {data}"), worker="0")] * prepare,
          tpu.ssh(start)]


def _code_dir(pack: pack_lib.Pack | None, repo_dir: str | None) -> str:
  """Where the code and its .venv are on each worker; a leading ~/ left unquoted, so
  that the worker's shell expands it."""
  if pack:
    return f"~/{CODE_HOME}/{pack.fingerprint}"
  return "~/" + shlex.quote(repo_dir[2:]) if repo_dir.startswith("~/") else shlex.quote(repo_dir)


def worker_log(run: trials_lib.Run) -> str:
  """The run's log on each worker, as the worker's shell reads it."""
  return (f"~/{LOGS}/{shlex.quote(epath.Path(run.workdir).parent.name)}/"
          f"{shlex.quote(run.trial.name)}.$(hostname).log")


def logs_dir(run: trials_lib.Run) -> epath.Path:
  """WORKDIR/logs: the workers' logs (TRIAL.HOST.log), copied there before the TPU goes."""
  return epath.Path(run.workdir) / "logs"


def save_logs(tpu: Tpu, run: trials_lib.Run, pack: pack_lib.Pack | None,
              repo_dir: str | None) -> list[str]:
  """The command that copies the last LOG_LINES lines of the run's log on every worker
  to logs_dir (each file whole or not there, written by the worker's own Python with
  the VM's credentials), so that the run's last line outlives the TPU."""
  target = shlex.quote(f"{logs_dir(run)}/{run.trial.name}.") + "$(hostname).log"
  write = ("import sys; from transformer_jax import files; "
           "files.write_atomic(sys.argv[1], sys.stdin.buffer.read())")
  return tpu.ssh(f"cd {_code_dir(pack, repo_dir)} && if [ -f {worker_log(run)} ]; then "
                 f"tail -n {LOG_LINES} {worker_log(run)} | .venv/bin/python -c "
                 f"{shlex.quote(write)} {target}; fi")


def call(command: Sequence[str]) -> subprocess.CompletedProcess:
  return subprocess.run(command, capture_output=True, text=True,
                        env=study_lib.without_secrets(os.environ))


def _last_line(result: subprocess.CompletedProcess) -> str:
  lines = (result.stderr or result.stdout).strip().splitlines()
  return lines[-1] if lines else f"exit {result.returncode}"


def preflight(tpu: Tpu) -> None:
  """Fails in one line when gcloud has no account, or the zone or accelerator type is
  not one that exists, before anything is created or copied."""
  accounts = call(["gcloud", "auth", "list", "--filter=status:ACTIVE",
                      "--format=value(account)"])
  if accounts.returncode or not accounts.stdout.strip():
    cli.fail("gcloud has no active account: run `gcloud auth login` (or `gcloud auth "
             "activate-service-account`), then launch again.")
  if not tpu.accelerator_type:
    return
  offered = call(tpu.gcloud("accelerator-types", "list", "--format=value(type)"))
  if offered.returncode:
    cli.fail(f"--zone={tpu.zone}: gcloud cannot list its TPU types: {_last_line(offered)}")
  types = offered.stdout.split()
  if tpu.accelerator_type not in types:
    near = difflib.get_close_matches(tpu.accelerator_type, types, n=3)
    cli.fail(f"--accelerator_type={tpu.accelerator_type} is not offered in {tpu.zone}"
             + (f"; did you mean {' or '.join(near)}?" if near else
                f"; it offers {', '.join(types) or 'none'}."))


def launch(runs: Sequence[trials_lib.Run], tpu: Tpu, pack: pack_lib.Pack | None,
           dry_run: bool, pack_dir: str, repo_dir: str | None, prepare: bool = False) -> int:
  """Ships the pack to an existing TPU and starts the runs on it, one after another."""
  commands = start_commands(tpu, runs, pack, pack_dir, repo_dir, prepare)
  for command in commands:
    print(shlex.join(command))
  if dry_run:
    return 0
  preflight(tpu)
  if pack:
    write_pack(pack, pack_dir)
  for command in commands:
    result = call(command)
    if result.returncode:
      cli.fail(f"{tpu.name}: `{shlex.join(command[:5])} ...` failed: {_last_line(result)}",
               code=1)
  print(f"# started, detached; follow with: "
        f"{shlex.join(tpu.ssh(f'tail -n 3 ~/{LOGS}/*/*.log'))}")
  return 0


def write_pack(pack: pack_lib.Pack, pack_dir: str) -> None:
  path = epath.Path(pack_dir) / pack.name
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(pack.data)


@dataclasses.dataclass
class Watched:
  """A trial the launcher keeps running on its own TPU, and what it saw of it so far."""
  run: trials_lib.Run
  tpu: Tpu
  started: bool = False  # The run was started on the TPU as it is now.
  failures: int = 0  # gcloud failures in a row.
  deaths: int = 0  # Runs gone without exit.json (never reset: a run that keeps dying).
  logs_saved: bool = False  # The workers' logs are in logs_dir.
  prepare: bool = False  # Its data prepared on worker 0 before the run starts.


def look(trial: Watched, pack: pack_lib.Pack | None, pack_dir: str, repo_dir: str | None,
         max_failures: int, log: Callable[[str], None]) -> str | None:
  """One look at a trial: acts on what it sees; 'done' or 'given up' when it ends."""
  name, tpu = trial.run.trial.name, trial.tpu
  say = lambda event: log(f"{name} on {tpu.name}: {event}")

  def run_gcloud(command: list[str], what: str) -> subprocess.CompletedProcess | None:
    result = call(command)
    if result.returncode == 0:
      return result
    trial.failures += 1
    say(f"{what} failed ({trial.failures} in a row): {_last_line(result)}")
    return None

  if trials_lib.finished(trial.run):
    return _finish(trial, pack, repo_dir, max_failures, run_gcloud, say)
  if trial.failures >= max_failures:
    say(f"giving up after {trial.failures} failures in a row; the workdir keeps every "
        "checkpoint: launch again to go on")
    return "given up"

  described = call(tpu.describe())
  state = described.stdout.strip() if described.returncode == 0 else None
  if state is None:
    if "not found" not in described.stderr.lower():
      trial.failures += 1
      say(f"describe failed ({trial.failures} in a row): {_last_line(described)}")
      return None
    trial.started = False
    if run_gcloud(tpu.create(), "create"):
      say(f"creating {tpu.accelerator_type}{' (spot)' * tpu.spot}")
  elif state in LOST:
    say(f"{state}: deleting it to create it again")
    run_gcloud(tpu.delete(), "delete")
  elif state in READY and not trial.started:
    _forget_exit(trial.run)
    commands = start_commands(tpu, [trial.run], pack, pack_dir, repo_dir, trial.prepare)
    steps = ("copy the code", "install", *["prepare the data"] * trial.prepare,
             "start")[-len(commands):]
    for step, command in zip(steps, commands):
      if not (result := run_gcloud(command, step)):
        return None
    trial.started, trial.failures = True, 0
    going = "starting nothing" in result.stdout  # Started before this launcher watched.
    say(f"code {pack.fingerprint if pack else repo_dir} in place; "
        + ("its run was already going" if going else "run started"))
  elif state in READY:
    ended = exit_code(trial.run)
    if ended is None and (dead := _dead_workers(tpu, trial.run)) is not None:
      if trials_lib.finished(trial.run) or exit_code(trial.run) is not None:
        return None  # It ended properly just now: the next look sees how.
      trial.deaths += 1
      run_gcloud(stop_run(tpu, "KILL"), "stop")
      if trial.deaths >= max_failures:
        say(f"the run died without exit.json {trial.deaths} times; giving up, its TPU "
            f"kept for the logs: delete it with {shlex.join(tpu.delete())}. {dead}")
        return "given up"
      say(f"the run died without exit.json (killed: out of memory?), {trial.deaths} of "
          f"{max_failures} allowed; starting it again. {dead}")
      trial.started = False
    elif ended == cli.EXIT_PREEMPTED:
      say("the run stopped on a signal after checkpointing; starting it again")
      trial.started = False
    elif ended is not None:
      _logs_saved(trial, pack, repo_dir, run_gcloud)
      say(f"the run failed with exit {ended} (see {trial.run.workdir}/exit.json and "
          f"{logs_dir(trial.run) if trial.logs_saved else f'~/{LOGS} on the workers'}); "
          f"its TPU is kept: delete it with {shlex.join(tpu.delete())}")
      return "given up"
  return None


def _finish(trial: Watched, pack: pack_lib.Pack | None, repo_dir: str | None,
            max_failures: int, run_gcloud: Callable, say: Callable[[str], None]
            ) -> str | None:
  """A finished trial's TPU deleted, its workers' logs first copied to the workdir:
  'done', or None to try again at the next look."""
  tpu = trial.tpu
  if "not found" in call(tpu.describe()).stderr.lower():
    say("results.json written")
    return "done"
  if trial.failures < max_failures and not _logs_saved(trial, pack, repo_dir, run_gcloud):
    return None  # Copy them at the next look: the TPU waits for it.
  saved = (f"the workers' logs in {logs_dir(trial.run)}" if trial.logs_saved else
           "the workers' logs not copied")
  if run_gcloud(tpu.delete(), "delete"):
    say(f"results.json written, {saved}; TPU deleted")
  elif trial.failures < max_failures:
    return None  # Delete it at the next look.
  else:
    say(f"results.json written, {saved}; the TPU is left: delete it with "
        f"{shlex.join(tpu.delete())}")
  return "done"


def _logs_saved(trial: Watched, pack: pack_lib.Pack | None, repo_dir: str | None,
                run_gcloud: Callable) -> bool:
  """Copies the workers' logs to logs_dir once; whether they are there."""
  if not trial.logs_saved:
    trial.logs_saved = bool(run_gcloud(save_logs(trial.tpu, trial.run, pack, repo_dir),
                                       "copy the workers' logs"))
  return trial.logs_saved


def stop_run(tpu: Tpu, signal: str) -> list[str]:
  """The command that sends `signal` (TERM: the run checkpoints and exits) to the run
  going on every worker of `tpu`."""
  return tpu.ssh(f"kill -{signal} -- -\"$(cat ~/{PID})\" 2>/dev/null; true")


def _dead_workers(tpu: Tpu, run: trials_lib.Run) -> str | None:
  """None while the run's process is alive on every worker (or gcloud cannot say); else
  which workers lost it, with their logs' last lines."""
  result = call(tpu.ssh(
      f"kill -0 \"$(cat ~/{PID} 2>/dev/null)\" 2>/dev/null || "
      f"{{ echo \"dead on $(hostname); its log ends:\"; tail -n 5 {worker_log(run)} "
      "2>/dev/null; }"))
  if result.returncode or "dead on " not in result.stdout:
    return None
  return " ".join(result.stdout.split())[-1500:]


def exit_code(run: trials_lib.Run) -> int | None:
  path = epath.Path(run.workdir) / "exit.json"
  return json.loads(path.read_text())["code"] if path.exists() else None


def _forget_exit(run: trials_lib.Run) -> None:
  (epath.Path(run.workdir) / "exit.json").unlink(missing_ok=True)
