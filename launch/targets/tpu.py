"""The TPU target: trials on Cloud TPU VMs (gcloud's commands: launch/tpu_vm.py).

With --accelerator_type, each trial gets a TPU of its own, `--parallel` at once: the
launcher checks that the trial fits the chip (compiling it here), creates the TPU,
ships the code and starts the run, and watches it every --poll_s (default 60 s) until
the trial's results.json exists, recreating a preempted TPU and starting the run again
(it resumes from its checkpoint); then it copies the workers' logs into the workdir
and deletes the TPU. A search runs each trial its study draws the same way, the
launcher holding the study. Without --accelerator_type the trials run one after
another on the existing TPU --tpu_name, unwatched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from absl import flags
from etils import epath

from launch import search as search_lib, study as study_lib, sweep, tpu_vm
from launch import trial_lease, trials as trials_lib
from launch.targets import TARGETS, Target
from transformer_jax import cli, files
from transformer_jax.planning import topology

POLL_S = 60.0  # Seconds between looks at each TPU, unless --poll_s.


@TARGETS.register("tpu")
class CloudTpu(Target):
  """Cloud TPU VMs, through gcloud."""

  @staticmethod
  def define_flags() -> None:
    flags.DEFINE_string("tpu_name", None, "tpu: the TPU VM's name; with --accelerator_type "
                        "the prefix of the TPUs created, NAME-0, NAME-1, ... (one per "
                        "trial).")
    flags.DEFINE_string("zone", None, "tpu: its zone.")
    flags.DEFINE_string("project", None, "tpu: its Google Cloud project (default: "
                        "gcloud's).")
    flags.DEFINE_string("accelerator_type", None, "tpu: create a TPU of this type per "
                        "trial (v5p-64, v6e-256, ...), keep it running until the trial is "
                        "done, then delete it.")
    flags.DEFINE_string("runtime_version", "tpu-ubuntu2204-base", "tpu: TPU VM software.")
    flags.DEFINE_bool("spot", False, "tpu: create spot (preemptible) TPUs.")
    flags.DEFINE_bool("queued_resource", False, "tpu: create them as queued resources.")
    flags.DEFINE_integer("parallel", 1, "tpu: trials running at once, each on its own TPU.")
    flags.DEFINE_integer("max_failures", 5, "tpu: give a trial up after this many gcloud "
                         "failures in a row.")
    flags.DEFINE_bool("skip_fit_check", False, "tpu: create the TPUs without first "
                      "compiling each trial's train step for --accelerator_type here "
                      "(libtpu) to see that it fits.")

  def hosts(self) -> int:
    return tpu_vm.hosts(self.flags.accelerator_type)

  def processes(self) -> int:
    return self.hosts()  # One process a host.

  def machine(self, name: str) -> tpu_vm.Tpu:
    f = self.flags
    return tpu_vm.Tpu(name, zone=f.zone, project=f.project,
                      accelerator_type=f.accelerator_type, runtime_version=f.runtime_version,
                      spot=f.spot, queued=f.queued_resource)

  def launch(self, experiment: sweep.Experiment, runs: Sequence[trials_lib.Run]) -> int:
    f = self.flags
    code = self.shipped_code("gcloud")
    self.check_shipped(runs, code)
    if not f.tpu_name or not f.zone:
      cli.fail("--target=tpu needs --tpu_name and --zone.")
    self._check_root()
    todo = self.unfinished(runs)
    if not todo:
      return 0
    record = self.code_record(code)
    if not f.accelerator_type:
      for run in todo if not f.dry_run else []:
        trials_lib.record(run, experiment, record)
      if f.dry_run and f.cost_on:
        self.print_costs(todo, f.cost_on)
      return tpu_vm.launch(todo, self.machine(f.tpu_name), code, f.dry_run, tpu_vm.PACKS,
                           f.repo_dir, self.prepare())
    index = {t.name: i for i, t in enumerate(experiment.trials)}
    tpus = [self.machine(f"{f.tpu_name}-{index[r.trial.name]}") for r in todo]
    if not f.dry_run:
      tpu_vm.preflight(tpus[0])  # gcloud's account and the zone's types: quick, so first.
    if not f.skip_fit_check:
      self._fit_check(todo)
    elif f.dry_run:
      self.print_costs(todo, f.cost_on or f.accelerator_type)
    for run, machine in zip(todo, tpus):
      print(f"# {run.trial.name} on {machine.name}:")
      for command in (machine.create(), *tpu_vm.start_commands(
          machine, [run], code, tpu_vm.PACKS, f.repo_dir, self.prepare()), machine.delete()):
        print(shlex.join(command))
    if f.dry_run:
      return 0
    for run in todo:
      trials_lib.record(run, experiment, record)
    log = log_to(trials_lib.experiment_dir(experiment, f.root, f.smoke) / "tpu_events.log")
    if code:
      tpu_vm.write_pack(code, tpu_vm.PACKS)
    waiting = [tpu_vm.Watched(r, t, prepare=self.prepare()) for r, t in zip(todo, tpus)]
    outcomes = self._watch(lambda: waiting.pop(0) if waiting else None,
                           lambda trial: tpu_vm.look(trial, code, tpu_vm.PACKS, f.repo_dir,
                                                     f.max_failures, log), log)
    if outcomes is None:
      return 130
    given_up = outcomes.count("given up")
    log(f"every trial is done; {given_up} gave up")
    return 1 if given_up else 0

  def check_search(self) -> None:
    f = self.flags
    if not (f.tpu_name and f.zone and f.accelerator_type):
      cli.fail("--target=tpu: a search needs --tpu_name, --zone and --accelerator_type: "
               "it creates a TPU for each trial it draws, and deletes it after")

  def search(self, experiment: sweep.Experiment, extra, storage: str) -> int:
    """Runs the search, `--parallel` trials at a time, each on a TPU of its own,
    TPU_NAME-NNN. The space's two ends are first checked to fit, as listed trials are.
    This launcher holds the study: it asks it for each next trial, reads every run's
    evaluations from ROOT (a bucket), and reports them; a trial the pruner stops gets
    SIGTERM on its TPU, checkpoints, and its TPU is deleted. Returns how many trials
    failed for good, or 130 after Ctrl-C (the runs go on; the same command watches them
    again)."""
    f = self.flags
    self._check_root()
    chips = self._check_trial_size(experiment)
    code = self.shipped_code("gcloud")
    if not f.dry_run:
      tpu_vm.preflight(self.machine(f.tpu_name))
    if not f.skip_fit_check:
      self._fit_check(search_lib.corner_runs(experiment, f.root, extra, f.smoke))
    print(search_lib.describe(experiment))
    machine = lambda name: self.machine(f"{f.tpu_name}-{name.removeprefix('trial')}")
    prepare = self.hosts() > 1  # Before the hosts' processes.

    def make_run(name: str, values: dict, workdir: str | None = None) -> trials_lib.Run:
      run = search_lib.trial_run(experiment, f.root, extra, f.smoke, name, values, workdir)
      return trials_lib.shared_data([run], f.root)[0] if prepare else run

    if f.dry_run:
      name = search_lib.trial_name(0)
      run = make_run(name, {p: "VALUE" for p in experiment.search.space})
      print(f"# each trial on a TPU of its own, {f.parallel} at a time, its values drawn by "
            f"the sampler; {name}:")
      commands = [machine(name).create(), *tpu_vm.start_commands(
          machine(name), [run], code, tpu_vm.PACKS, f.repo_dir, prepare),
                  machine(name).delete()]
      print("\n".join(shlex.join(c) for c in commands))
      print("# a trial the pruner stops: " + shlex.join(tpu_vm.stop_run(machine(name), "TERM")))
      return 0
    study = study_lib.open_study(experiment, storage)
    folder = trials_lib.experiment_dir(experiment, f.root, f.smoke)
    log = log_to(folder / "tpu_events.log")
    record = self.code_record(code)
    if code:
      tpu_vm.write_pack(code, tpu_vm.PACKS)

    seen = trial_lease.Seen()

    def take() -> _SearchTrial | None:
      drawn = search_lib.next_trial(study, experiment.search, seen, wait=False)
      if drawn is None:
        return None
      trial, claim = drawn
      name = trial.user_attrs["name"]
      run = make_run(name, trial.params, trial.user_attrs.get("workdir"))
      trials_lib.record(run, experiment, record)
      return _SearchTrial(tpu_vm.Watched(run, machine(name), prepare=prepare),
                          search_lib.Reporter(study, trial, experiment.search, run), claim,
                          self.hosts(), chips)

    def look(entry: _SearchTrial) -> str | None:
      if (ended := entry.look(code, f.repo_dir, f.max_failures, log)) is not None:
        entry.claim.release()
      return ended

    outcomes = self._watch(take, look, log)
    if outcomes is None:
      return 130
    failures = outcomes.count("failed")
    log(f"search done: {len(study.get_trials(deepcopy=False))} trials; {failures} failed; "
        + search_lib.spent(study.get_trials(deepcopy=False), experiment.search))
    search_lib.write_best(study, experiment, f.root, f.smoke)
    return 1 if failures else 0

  def _watch(self, take: Callable[[], Any], look: Callable[[Any], str | None],
             log: Callable[[str], None]) -> list[str] | None:
    """Keeps up to --parallel trials going, each on its own TPU (an entry with a `tpu`):
    takes the next (`take`, None when none is left) as one ends, and looks at each every
    --poll_s (`look`: how it ended, or None while it goes on). Returns how each ended,
    or None after Ctrl-C, which stops the watching only."""
    active, outcomes = [], []
    try:
      while True:
        while len(active) < self.flags.parallel and (entry := take()) is not None:
          active.append(entry)
        if not active:
          return outcomes
        for entry in list(active):
          if (outcome := look(entry)) is not None:
            active.remove(entry)
            outcomes.append(outcome)
        if active:
          time.sleep(self.flags.poll_s or POLL_S)
    except KeyboardInterrupt:
      log("stopped watching (Ctrl-C); the runs go on, their TPUs stay: "
          + (", ".join(e.tpu.name for e in active) or "none")
          + ". Launch the same command to watch them again.")
      return None

  def _check_trial_size(self, experiment: sweep.Experiment) -> int:
    """The chips of --accelerator_type, each trial's TPU, after refusing in one line a
    search whose trial_devices another type has: a trial here is a whole TPU (of one
    host or many), never a share of one."""
    f, size = self.flags, experiment.search.trial_devices
    try:
      tpu = topology.parse_tpu(f.accelerator_type)
    except ValueError:  # A type this code does not know: gcloud's check names it.
      return 1
    if size is None or size == tpu.chips:
      return tpu.chips
    prefix, _, count = f.accelerator_type.rpartition("-")
    other = f"{prefix}-{size * int(count) // tpu.chips}"
    try:
      hint = f" (e.g. --accelerator_type={topology.parse_tpu(other).accelerator_type})"
    except ValueError:
      hint = ""
    cli.fail(f"{experiment.path}: SEARCH trial_devices={size}, but each trial here gets a "
             f"TPU of its own, and a {f.accelerator_type} has {tpu.chips} chips: give a "
             f"type of {size} chips{hint}, or trial_devices=None")

  def _check_root(self) -> None:
    """A slice of several hosts needs a bucket for --root: a local one is refused."""
    f = self.flags
    if f.accelerator_type and not files.is_remote(f.root):
      try:
        hosts = topology.parse_tpu(f.accelerator_type).hosts
      except ValueError:  # A type this code does not know: gcloud's check names it.
        hosts = 1
      if hosts > 1:
        cli.fail(f"--root={f.root} is a local directory, but a {f.accelerator_type} has "
                 f"{hosts} hosts: each would write its own checkpoints, and this launcher "
                 "could not see them; give a bucket every host reads, "
                 "--root=gs://BUCKET/runs.")

  def _fit_check(self, runs: Sequence[trials_lib.Run]) -> None:
    """Compiles each trial's train step for --accelerator_type on this machine (libtpu's
    compile-only devices), before any TPU exists; refuses, in one line, a trial that
    would not fit, naming what would."""
    accelerator_type = self.flags.accelerator_type
    env = {**study_lib.without_secrets(os.environ), "JAX_PLATFORMS": "cpu"}
    print(f"# checking that each trial fits {accelerator_type}: its train step, eval step "
          "and beam search compiled here with libtpu (minutes a trial for base and big; "
          "--skip_fit_check skips it)", flush=True)
    for run in runs:
      args = [a for a in run.args if not a.startswith("--workdir=")]
      print(f"# {run.trial.name}: compiling for {accelerator_type} ...", flush=True)
      start = time.time()
      out = subprocess.run([sys.executable, "-m", "transformer_jax.benchmark", *args,
                            f"--topology={accelerator_type}", "--json"],
                           capture_output=True, text=True, env=env)
      if out.returncode:
        lines = out.stderr.strip().splitlines() or ["(no output)"]
        cli.fail(f"{run.trial.name}: {lines[-1].removeprefix('error: ')} (checked here "
                 "with libtpu; --skip_fit_check creates the TPU anyway)")
      fit = json.loads(out.stdout)
      print(f"# {run.trial.name}: fits {accelerator_type}, {fit['total_gib']:.2f} of "
            f"{fit['hbm_gib']:.0f} GiB a chip, mesh {fit['mesh']}; estimated "
            f"({fit['estimate']}) {fit['estimated_step_s'] * 1e3:.1f} ms a step (checked in "
            f"{time.time() - start:.0f} s)", flush=True)
      self.print_costs([run], accelerator_type, fit)


@dataclasses.dataclass
class _SearchTrial:
  """A trial of a search on its TPU: what the TPU launcher sees of it, its account
  with the study, and this launcher's claim on it."""
  watched: tpu_vm.Watched
  reporter: search_lib.Reporter
  claim: trial_lease.Hold
  hosts: int
  devices: int  # The TPU's chips, for the search's device-hours.
  stopping: int | None = None  # Looks since its run got SIGTERM (pruned).
  started: float = dataclasses.field(default_factory=time.time)

  @property
  def tpu(self) -> tpu_vm.Tpu:
    return self.watched.tpu

  def look(self, pack, repo_dir, max_failures, log) -> str | None:
    """One look: how the trial ended ("done", "pruned", "failed"), or None."""
    run, tpu = self.watched.run, self.watched.tpu
    say = lambda event: log(f"{run.trial.name} on {tpu.name}: {event}")
    if self.stopping is not None:  # Pruned: its TPU goes once the run has checkpointed.
      if tpu_vm.exit_code(run) is None and self.stopping < max_failures:
        self.stopping += 1
        return None
      deleted = tpu_vm.call(tpu.delete()).returncode == 0
      say("its run stopped; TPU deleted" if deleted else
          f"the TPU is left: delete it with {shlex.join(tpu.delete())}")
      return "pruned"
    if self.reporter.watch():
      tpu_vm.call(tpu_vm.stop_run(tpu, "TERM"))
      self.spend()
      self.reporter.end(False, "")
      say(f"pruned at step {self.reporter.pruned_at}; its run stops (SIGTERM: it "
          "checkpoints), then its TPU is deleted")
      self.stopping = 0
      return None
    outcome = tpu_vm.look(self.watched, pack, tpu_vm.PACKS, repo_dir, max_failures, log)
    if outcome is None:
      return None
    self.spend()
    ended = self.reporter.end(outcome == "done", f"on {tpu.name}: see {run.workdir}/"
                              "exit.json and tpu_events.log")
    if ended == "diverged" and tpu_vm.call(tpu.delete()).returncode == 0:
      say("TPU deleted (its run diverged; its logs are in its workdir)")
    return ended


  def spend(self) -> None:
    """The TPU's time since this launcher took the trial, recorded before it ends."""
    search_lib.spend(self.reporter.trial, self.hosts, self.devices,
                     time.time() - self.started, self.tpu.name)


def log_to(path: epath.PathLike) -> Callable[[str], None]:
  """Prints each event with its time and appends it to `path`."""
  def log(event: str) -> None:
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {event}"
    print(line, flush=True)
    try:
      files.append_line(path, line)
    except OSError as e:
      print(f"# could not append to {path}: {e}", file=sys.stderr)
  return log
