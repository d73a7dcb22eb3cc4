"""An experiment's trials as runs, whatever the target (launch/targets/): each trial's
workdir and command line, its config checked, whether it is finished, and its record.

Each trial trains in ROOT/EXPERIMENT/TRIAL (named from its overrides; --smoke trials in
ROOT/EXPERIMENT_smoke/TRIAL, never beside full ones), where the run saves its resolved
config; a trial whose workdir has results.json is finished and is skipped, and an
unfinished one resumes from its latest checkpoint. ROOT may be local or gs://.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from typing import Sequence

from absl import flags
from etils import epath
from ml_collections import config_flags

from launch.sweep import Experiment, Trial, format_value
from transformer_jax import cli, config as config_lib, files
from transformer_jax.data import corpora


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
