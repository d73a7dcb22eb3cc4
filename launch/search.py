r"""Adaptive searches: Optuna proposes each next trial from the results so far, and stops
losing trials early.

An experiment file defines SEARCH instead of `trials()`:

    SEARCH = search.Search(
        space={"optimizer.learning_rate_multiplier": search.log_uniform(0.1, 10.0),
               "optimizer.warmup_steps": search.integer(100, 2000, log=True),
               "model.dropout_rate": search.uniform(0.0, 0.3)},
        metric="eval/loss", trials=16)

The study lives in a database (--storage; by default SQLite in the experiment's
folder, ROOT/EXPERIMENT/study.db). Each trial trains in ROOT/EXPERIMENT/trialNNN as
any trial does. While it trains, the launcher reads its held-out metric at every
evaluation from its event files and reports it to the study. When the pruner says
stop, the run gets SIGTERM, checkpoints and exits; the trial is *pruned*, with the
step (WORKDIR/pruned.json), and a relaunch never resumes it. A finished trial's value is
the best of its metric over its evaluations. A trial that fails is retried, as the same
trial in its own workdir (from its checkpoints), at most `retries` times. A launcher
killed mid-study leaves its trial RUNNING: a launcher resumes it with the same values
once the study shows its launcher gone. Which launcher holds which trial is recorded in
the study (launch/trial_lease.py), so launchers sharing one study, with a --root each,
never train one trial twice.

Where the trials train is the target's (launch/targets/): each runs a search with
what this module gives, the study's next trial (`next_trial`) and its account with
the study (`Reporter`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
import sys
import time

from etils import epath

from launch import sweep, trial_lease, trials as trials_lib
# The names experiments' SEARCH is written with (search.Search, search.uniform, ...).
from launch.search_space import (Search, choice, integer, log_uniform,  # noqa: F401
                                 uniform)
from transformer_jax import cli, config as config_lib, files, summaries
from transformer_jax.training import workdir_lock

POLL_S = 5.0  # How often a trial trained here has its event files read for new evaluations.


def check(experiment: sweep.Experiment, root: str, extra, smoke: bool) -> None:
  """Before any study exists or anything trains: the search's own mistakes, then every
  field of the space at its bounds through the config's checks, then whether the runs
  log the metric (a BLEU needs train.bleu_every_steps)."""
  search = experiment.search
  for problem in search.problems():
    cli.fail(f"{experiment.path}: SEARCH {problem}")
  for end, run in zip(("low", "high"), corner_runs(experiment, root, extra, smoke)):
    config, error = trials_lib.parse(run)
    if error:
      cli.fail(f"{experiment.path}: SEARCH space, at its {end} end: {error}")
  computed = config_lib.METRICS[search.metric.rsplit("/", 1)[-1]].computed
  if computed == "bleu" and not config.train.bleu_every_steps:
    cli.fail(f"{experiment.path}: SEARCH metric={search.metric!r} is computed by "
             "translating, and these runs translate only at the end "
             "(train.bleu_every_steps=0): set it in the config or with --set, or search "
             "on eval/loss")


def corner_runs(experiment: sweep.Experiment, root: str, extra, smoke: bool
                ) -> list[trials_lib.Run]:
  """A run at each end of the space (its lowest values, then its highest)."""
  return [trial_run(experiment, root, extra, smoke, f"{end}_end", values)
          for end, values in zip(("low", "high"), experiment.search.corners())]


def trials_config(experiment: sweep.Experiment, root: str, extra, smoke: bool) -> dict:
  """What every trial trains with but its drawn values, as its study stores it (another
  is refused): the resolved config (CONFIG, every --set, the fixed values) by field,
  the space's fields left out."""
  config, _ = trials_lib.parse(corner_runs(experiment, root, extra, smoke)[0])
  return {f"{section.name}.{field.name}": getattr(getattr(config, section.name), field.name)
          for section in dataclasses.fields(config)
          for field in dataclasses.fields(getattr(config, section.name))
          if f"{section.name}.{field.name}" not in experiment.search.space}


def trial_run(experiment, root, extra, smoke, name, values,
              workdir: str | None = None) -> trials_lib.Run:
  """The run of a search's trial `name`: the config with `values` of its space and the
  search's fixed values, in `workdir` (a resumed trial's, where its checkpoints are,
  whichever launcher started it), else ROOT/EXPERIMENT/NAME."""
  trial = sweep.Trial(name, tuple(sorted({**experiment.search.fixed, **values}.items())))
  config = experiment.config + (",smoke" if smoke else "")
  workdir = workdir or str(trials_lib.experiment_dir(experiment, root, smoke) / name)
  return trials_lib.Run(trial, workdir, (
      f"--config={config}", f"--workdir={workdir}", *trial.flags,
      *(f"--config.{path}={value}" for path, value in extra)))


def trial_name(number: int) -> str:
  return f"trial{number:03d}"


def describe(experiment: sweep.Experiment) -> str:
  """The search in comment lines: its budget, sampler, pruner and space (where its study
  is, resolve_storage has said once already)."""
  search = experiment.search
  options = "".join(f", {k}={v!r}" for k, v in search.sampler_options.items())
  pruner = {"none": "none", "median": f"median from evaluation {search.first_rung}"}.get(
      search.pruner, f"{search.pruner}, first rung at evaluation {search.first_rung}, "
      f"keeping 1 in {search.reduction_factor}")
  hours = (f" or {search.device_hours:g} device-hours, whichever is spent first,"
           if search.device_hours is not None else "")
  size = (f"; {search.trial_devices} devices a trial" if search.trial_devices else "")
  lines = [f"# search: {search.trials} trials{hours} by {search.sampler} (seed {search.seed}"
           f"{options}), pruner {pruner}; {search.direction} {search.metric}; a diverged "
           f"trial fails, not retried; other failures retried up to "
           f"{search.retries} times{size}"]
  lines += [f"#   {path}: {d.describe()}" for path, d in search.space.items()]
  lines += [f"#   {path}: {value!r} (fixed)" for path, value in search.fixed.items()]
  lines += [f"# warning: {warning}" for warning in search.warnings()]
  return "\n".join(lines)


def _best(study):
  try:
    return study.best_trial
  except ValueError:  # No finished trial.
    return None


def best_again(study, experiment: sweep.Experiment) -> str | None:
  """The best trial so far, its value, and the command that trains it again from
  scratch in a workdir of its own (WORKDIR_again), as it was launched (--set included,
  from its trial.json); where trials ended and none finished, a line that says how
  they ended; None before any trial has ended."""
  best = _best(study)
  if best is None:
    return _no_best(study, experiment)
  if "workdir" not in best.user_attrs:
    return None
  workdir = best.user_attrs["workdir"]
  args = json.loads(epath.Path(workdir, "trial.json").read_text())["args"]
  args = [f"--workdir={workdir}_again" if a.startswith("--workdir=") else a for a in args]
  return (f"# best: {best.user_attrs['name']}, {experiment.search.metric} {best.value:.4g}; "
          f"trained again by:\n{shlex.join(['python', '-m', 'transformer_jax.main', *args])}")


def _no_best(study, experiment: sweep.Experiment) -> str | None:
  """'# best: none ...' with how the trials ended (diverged, pruned, failed), or None
  while none has ended."""
  ended = [t for t in counted(study.get_trials(deepcopy=False)) if t.state.is_finished()]
  if not ended:
    return None
  how = ["diverged" if "diverged" in t.user_attrs else
         t.state.name.lower().replace("fail", "failed") for t in ended]
  counts = ", ".join(f"{how.count(h)} {h}" for h in sorted(set(how)))
  hint = "; every trial diverged (its loss went non-finite: WORKDIR/exit.json says " \
      "where): narrow the space (lower learning rates, longer warmups) and search " \
      "again" if set(how) == {"diverged"} else ""
  return f"# best: none, no trial of {experiment.name} finished ({counts}){hint}"


def write_best(study, experiment: sweep.Experiment, root: str, smoke: bool) -> None:
  """Prints the best trial's command (best_again), or why there is none, and writes it
  to ROOT/EXPERIMENT/best.txt."""
  if text := best_again(study, experiment):
    print(text)
    files.write_atomic(trials_lib.experiment_dir(experiment, root, smoke) / "best.txt",
                       text + "\n")


def next_trial(study, search: Search, seen: trial_lease.Seen, wait: bool = True):
  """(a trial to train, this launcher's hold on it), its values those drawn for it: a
  RUNNING trial that is free (trial_lease: a failure to retry, a dead launcher's), else
  a new one while both budgets last (the trials, the device-hours: one started goes on
  to its end, retries included). With a budget spent, and `wait`, it waits while other
  launchers' trials run, to resume any whose launcher dies; else None."""
  import optuna
  states = optuna.trial.TrialState
  while True:
    if (resumed := _resume(study, search, seen)) is not None:
      return resumed
    trials = study.get_trials(deepcopy=False)
    waiting = any(t.state == states.WAITING for t in trials)
    if (len(counted(trials)) >= search.trials and not waiting) or hours_spent(trials, search):
      if not wait or not any(t.state == states.RUNNING for t in trials):
        return None
      time.sleep(POLL_S)  # Nothing to start: other launchers' trials run; one whose
      continue  # launcher dies is resumed here.
    trial = study.ask()
    held = trial_lease.hold(study, trial)
    if "retry_of" not in trial.user_attrs and len(counted(
        t for t in study.get_trials(deepcopy=False) if t.number < trial.number)) >= search.trials:
      # Another launcher asked for the budget's last trial at the same moment.
      trial.set_user_attr("over_budget", True)
      study.tell(trial, state=states.FAIL)
      held.release()
      continue  # The budget is spent: wait for the others' trials, as above.
    _draw(study, trial, search)
    if "name" not in trial.user_attrs:
      trial.set_user_attr("name", trial_name(trial.number))
    return trial, held


def _resume(study, search: Search, seen: trial_lease.Seen):
  """(a free RUNNING trial, this launcher's hold on it), its values drawn again (the
  same: they are the trial's), or None. One its launcher had pruned (pruned.json
  written, the study not yet told) is told so instead."""
  import optuna
  states = optuna.trial.TrialState
  for frozen in study.get_trials(deepcopy=False):
    if frozen.state != states.RUNNING or not (why := seen.why_free(frozen)):
      continue
    if (workdir := frozen.user_attrs.get("workdir")) and workdir_lock.live_holder(workdir):
      continue  # Its run outlived its launcher (kill -9) and still trains: not taken
      # (it would end "elsewhere" and be taken again) until that run ends.
    trial = optuna.trial.Trial(study, frozen._trial_id)
    if (held := trial_lease.take(study, trial, frozen)) is None:
      continue  # Another launcher took it, or told it, meanwhile.
    if workdir and _pruned(workdir):  # Its launcher stopped between pruned.json and
      study.tell(frozen.number, state=states.PRUNED)  # telling the study.
      held.release()
      continue
    _draw(study, trial, search)
    if "name" not in trial.user_attrs:  # Its launcher died before naming it.
      trial.set_user_attr("name", trial_name(trial.number))
    print(f"# {trial.user_attrs['name']}: {why}: resuming it with the same values",
          flush=True)
    return trial, held
  return None


def hours_spent(trials, search: Search) -> bool:
  """Whether the search's device-hours (Search.device_hours) are spent: no new trial
  starts then. One that started before goes on to its end, a retry included."""
  return search.device_hours is not None and device_hours(trials) >= search.device_hours


def device_hours(trials) -> float:
  """The device-hours the trials' launchers recorded (`spend`); trials added from
  elsewhere (warm_start.py) cost this search nothing."""
  return sum(t.user_attrs.get("device_seconds", 0.0) for t in trials
             if "warm_start" not in t.user_attrs) / 3600


def spend(trial, hosts: int, devices: int, seconds: float, where: str) -> None:
  """Records in the study, before the trial is told how it ended, the wall time its
  launcher saw it train on `devices` devices over `hosts` machines (added to an earlier
  launcher's, for a resumed trial), and `where`: the budget's account."""
  spent = trial.user_attrs.get("device_seconds", 0.0) + devices * seconds
  for key, value in {"hosts": hosts, "devices": devices, "device_seconds": spent,
                     "where": where}.items():
    trial.set_user_attr(key, value)


def spent(trials, search: Search) -> str:
  """What the search has spent of its budgets: trials and device-hours."""
  of = f" of {search.device_hours:g}" if search.device_hours is not None else ""
  return (f"budget: {len(counted(trials))} of {search.trials} trials, "
          f"{device_hours(trials):.3g}{of} device-hours spent"
          + " (the device-hours are spent: no trial starts)" * hours_spent(trials, search))


def counted(trials) -> list:
  """The trials that count against the budget: not asked past it, not added from
  elsewhere (warm_start.py), not a retry queued as a trial of its own (studies made
  before a retry was the same trial)."""
  return [t for t in trials if "retry_of" not in t.user_attrs and "warm_start" not in
          t.user_attrs and not t.user_attrs.get("over_budget")]


def _draw(study, trial, search: Search) -> None:
  """The trial's values, from a sampler seeded by the search's seed and the trial's
  number (which the study gives each trial once): launchers sharing a study draw from
  different streams, a relaunch after a kill does not draw an earlier trial's values
  again, and the same study from scratch draws the same values. A resumed or retried
  trial gets the values already stored on it."""
  study.sampler = search.make_sampler(trial.number)
  for path, distribution in search.space.items():
    distribution.suggest(trial, path)


def take_claim(claims: epath.Path, name: str):
  """This launcher's lease on trial `name`, or None if a live launcher holds it."""
  try:
    return workdir_lock.Lease(claims / name).acquire()
  except workdir_lock.Busy:
    return None


def _pruned(workdir: str) -> bool:
  return epath.Path(workdir, "pruned.json").exists()


class Reporter:
  """One trial's account with the study, wherever it trains: each evaluation reported
  once as its event files show it (`watch`: True when the pruner says stop), and how
  it ended told once (`end`), with pruned.json for a pruned trial; a failed one stays
  RUNNING while retries last, to be resumed (next_trial) once its launcher releases it."""

  def __init__(self, study, trial, search: Search, run: trials_lib.Run):
    self.study, self.trial, self.search, self.run = study, trial, search, run
    self.name = trial.user_attrs["name"]
    trial.set_user_attr("workdir", run.workdir)
    config, error = trials_lib.parse(run)
    if error:
      raise ValueError(f"{self.name}: {error}")  # The search's check parsed its corners.
    self.every, self.last = search.every(config), config.train.num_train_steps
    study.pruner = search.make_pruner(config)  # Its rungs in this trial's evaluations.
    # evaluation number -> value reported to the study (a resumed trial's included).
    self.reported = dict(next(t for t in study.get_trials(deepcopy=False)
                              if t.number == trial.number).intermediate_values)
    self.pruned_at: int | None = None  # The training step it was stopped at.
    print(f"# {self.name}: " + " ".join(f"{k}={sweep.format_value(v)}"
                                         for k, v in run.trial.overrides), flush=True)

  def watch(self, prune: bool = True) -> bool:
    if self.pruned_at is not None:
      return True
    for step, value in evaluations(self.run.workdir, self.search.metric):
      number = self.evaluation(step)
      if number in self.reported or not math.isfinite(value):
        continue
      self.reported[number] = value
      self.trial.report(value, number)
      if prune and step < self.last and self.trial.should_prune():
        self.pruned_at = step
        return True
    return False

  def evaluation(self, step: int) -> int:
    """Which evaluation of the metric in its run step `step`'s is (its k-th BLEU
    pass, for a BLEU): the pruners' unit."""
    return -(-step // self.every)

  def end(self, trained: bool, details: str) -> str:
    """Tells the study: "pruned", "done" (`trained` to the end, its value the best of
    its evaluations), "diverged" (its loss went non-finite, exit 3: failed, as Optuna
    has a non-finite value, so that no sampler ranks it above a finished or pruned
    trial, and no retry), "retried" (anything else, while retries last: the trial stays
    RUNNING, released, to be trained again as itself) or "failed" (given up; `details`
    says where to look). Only "failed" makes a search's exit status 1."""
    import optuna
    search, trial, name = self.search, self.trial, self.name
    self.watch(prune=False)  # The evaluations written since the last look: an ended run
    # is not pruned after the fact.
    if self.pruned_at is not None:
      step, number = self.pruned_at, self.evaluation(self.pruned_at)
      files.write_atomic(epath.Path(self.run.workdir) / "pruned.json", json.dumps(
          {"step": step, "evaluation": number, "metric": search.metric,
           "value": self.reported[number]}))
      self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
      print(f"# {name}: pruned at step {step} (evaluation {number})", flush=True)
      return "pruned"
    values = [v for _, v in evaluations(self.run.workdir, search.metric) if math.isfinite(v)]
    if trained and values:
      best = min(values) if search.direction == "minimize" else max(values)
      self.study.tell(trial, best if search.trial_value == "best" else values[-1])
      return "done"
    ended = {} if trained else _exit_record(self.run.workdir)
    if ended.get("code") == cli.EXIT_NONFINITE:
      trial.set_user_attr("diverged", ended.get("reason", "")[:300])
      self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
      print(f"# {name}: diverged; told to the study as failed (no sampler learns from it "
            "as a good trial), and not retried", file=sys.stderr, flush=True)
      return "diverged"
    reason = f"it logged no {search.metric}" if trained else "its run failed"
    tries = trial.user_attrs.get("failures", 0) + 1
    trial.set_user_attr("failures", tries)
    trial.set_user_attr("failure", f"{reason} ({details})")
    if tries <= search.retries:  # It stays RUNNING, the same trial: its evaluations and
      # its Hyperband bracket stay its own. Released by its launcher, it is resumed next.
      print(f"# {name}: failed ({reason}); trying it again (retry {tries} of "
            f"{search.retries})", file=sys.stderr, flush=True)
      return "retried"
    else:
      self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
      print(f"# {name}: failed ({reason}), {tries} times: given up", file=sys.stderr,
            flush=True)
    return "failed"


def _exit_record(workdir: str) -> dict:
  """WORKDIR/exit.json, how its run last ended ({} if it has none)."""
  path = epath.Path(workdir) / "exit.json"
  try:
    return json.loads(path.read_text())
  except (FileNotFoundError, ValueError):
    return {}


def evaluations(workdir: str, metric: str) -> list[tuple[int, float]]:
  """(step, value) of `metric` in a workdir's event files, by step."""
  series = summaries.read_scalars(workdir).get(metric, [])
  return sorted({step: value for step, value, _ in series}.items())
