"""What a search starts from besides its sampler's draws: the config's own values as
its first trial (Search.start_from_config), and the finished trials of a grid or of an
earlier search, added to its study with their values (launch --warm_start=EXPERIMENT.py)
so that the sampler learns from them from its first draw. Added trials do not count
against the budget."""

from __future__ import annotations

import json
import math
import time
from typing import Any, Sequence

from etils import epath

from launch import search as search_lib, study as study_lib, sweep, trials as trials_lib
from transformer_jax import cli


def config_values(experiment: sweep.Experiment, root: str, extra, smoke: bool) -> dict:
  """The config's own values of the space's fields (with --set), checked to be in it."""
  run = search_lib.trial_run(experiment, root, extra, smoke, "config", {})
  config, error = trials_lib.parse(run)
  if error:
    cli.fail(f"{experiment.path}: {error}")
  values = {path: _lookup(config, path) for path in experiment.search.space}
  _check(experiment, values, "SEARCH start_from_config: the config's")
  return values


def finished_trials(experiment: sweep.Experiment, source_path: str, root: str,
                    smoke: bool) -> list[dict[str, Any]]:
  """The finished trials of experiment `source_path` under the same root: a grid's
  trials that wrote results.json, or a search's complete trials (not added ones); each
  {"name", "workdir", "params": the values of this search's fields (the run's
  config.json), "value": this search's metric over its evaluations, as its trial_value
  says}. A value outside this search's space ends the command in one line."""
  source = sweep.load_experiment_or_exit(source_path)
  metric = experiment.search.metric
  if source.search is None:
    workdirs = {r.trial.name: r.workdir for r in trials_lib.plan(source, root, smoke=smoke)
                if trials_lib.finished(r)}
  else:
    study = study_lib.open_study(source, study_lib.resolve_storage(source, root, smoke, None),
                                 create=False)
    workdirs = {t.user_attrs["name"]: t.user_attrs["workdir"] for t in
                (study.get_trials(deepcopy=False) if study else ())
                if t.state.name == "COMPLETE" and "workdir" in t.user_attrs
                and not {"warm_start", "diverged"} & set(t.user_attrs)}
  out = []
  for name, workdir in sorted(workdirs.items()):
    values = [v for _, v in search_lib.evaluations(workdir, metric) if math.isfinite(v)]
    if not values:
      continue
    config = json.loads(epath.Path(workdir, "config.json").read_text())
    params = {path: _lookup(config, path) for path in experiment.search.space}
    _check(experiment, params, f"--warm_start={source_path}: trial {name}'s")
    best = min(values) if experiment.search.direction == "minimize" else max(values)
    out.append({"name": f"{source.name}/{name}", "workdir": workdir, "params": params,
                "value": values[-1] if experiment.search.trial_value == "final" else best,
                "source": source.name})
  if not out:
    where = "its study" if source.search else trials_lib.experiment_dir(source, root, smoke)
    print(f"# --warm_start={source_path}: no finished trial in {where}: nothing added")
  return out


def start(study, experiment: sweep.Experiment, claims: epath.Path,
          config: dict | None, added: Sequence[dict[str, Any]]) -> None:
  """Queues `config` (the config's values) as a new study's first trial, and adds each
  of the `added` trials the study does not have yet (by name: a launcher killed
  midway, or launchers starting at once under the claim, add each once)."""
  import optuna
  while (claim := search_lib.take_claim(claims, "warm_start")) is None:
    time.sleep(0.5)  # Another launcher is adding them.
  try:
    if config is not None and not study.get_trials(deepcopy=False):
      study.enqueue_trial(config, user_attrs={"from_config": True})
      print("# the first trial trains the config's own values: "
            + " ".join(f"{k}={sweep.format_value(v)}" for k, v in config.items()))
    there = {t.user_attrs.get("name") for t in study.get_trials(deepcopy=False)}
    new = [t for t in added if t["name"] not in there]
    for trial in new:
      study.add_trial(optuna.trial.create_trial(
          params=trial["params"], distributions=experiment.search.distributions(),
          value=trial["value"], user_attrs={"name": trial["name"], "workdir": trial["workdir"],
                                            "warm_start": trial["source"]}))
    if new:
      print(f"# added {len(new)} finished trials of "
            f"{', '.join(sorted({t['source'] for t in new}))} to the study, with their "
            f"{experiment.search.metric}")
  finally:
    claim.release()


def _lookup(config, path: str) -> Any:
  """The value at `path` of a parsed config or of its config.json."""
  for key in path.split("."):
    config = config[key] if isinstance(config, dict) else getattr(config, key)
  return config


def _check(experiment: sweep.Experiment, values: dict, whose: str) -> None:
  for path, value in values.items():
    distribution = experiment.search.space[path]
    if not distribution.contains(value):
      cli.fail(f"{whose} {path}={value!r} is outside the SEARCH space of "
               f"{experiment.path} ({distribution.describe()})")


def prepare(experiment: sweep.Experiment, storage: str, root: str, extra, smoke: bool,
            sources: Sequence[str], dry_run: bool, allow_change: bool, code: str | None,
            allow_code_change: bool) -> None:
  """Before a search runs anywhere: what it starts from, checked (a value outside the
  space ends the command in one line), then its study opened here (a storage that
  cannot be opened, or a changed SEARCH, config or `code`, refused before anything
  trains or is submitted: study.open_study), where it is remembered
  (ROOT/EXPERIMENT/storage.json) and warm-started. A dry run checks only."""
  config = config_values(experiment, root, extra, smoke) \
      if experiment.search.start_from_config else None
  added = [t for path in sources for t in finished_trials(experiment, path, root, smoke)]
  if dry_run:
    parts = ["the config's own values"] * (config is not None) + [
        f"{len(added)} finished trials of {', '.join(sources)}"] * bool(added)
    if parts:
      print("# would start from " + " and ".join(parts))
    return
  study = study_lib.open_study(
      experiment, storage, allow_change=allow_change, code=code,
      config=search_lib.trials_config(experiment, root, extra, smoke),
      allow_code_change=allow_code_change)
  study_lib.remember_storage(experiment, root, smoke, storage)
  start(study, experiment, trials_lib.experiment_dir(experiment, root, smoke) / "claims",
        config, added)
