"""Adaptive searches (launch/search.py): a study in SQLite, trials proposed by a seeded
sampler, losing trials pruned at an evaluation and never resumed, a launcher killed
mid-study resumed without sampling its trial again, bad input refused in one line."""

import contextlib
import csv
import dataclasses
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
import types

import pytest

from conftest import ROOT, run_commands
from launch import results, search, study as study_lib, sweep, trial_lease
from launch import trials as trials_lib
from launch.targets import slurm

SPACE = '''{"optimizer.learning_rate_multiplier": search.log_uniform(0.01, 10.0),
           "model.dropout_rate": search.uniform(0.0, 0.3)}'''


def _experiment(tmp_path, name="tiny_search", space=SPACE, **options):
  settings = {"metric": '"eval/loss"', "trials": "4", "seed": "0", **options}
  text = (f'"""A tiny search."""\nfrom launch import search\n'
          f'CONFIG = "configs/transformer.py:numbers"\n'
          f'SEARCH = search.Search(space={space}, '
          + ", ".join(f"{k}={v}" for k, v in settings.items()) + ")\n")
  path = tmp_path / f"{name}.py"
  path.write_text(text)
  return path


# The smoke config with one length bucket: one train step to trace and compile a
# trial, not two (13 user-s a trial, not 15).
SMOKE = ("--smoke", "--set=train.max_length_buckets=1")
# 40 steps, an evaluation every 5: eight chances to prune, each seen within half a
# second (a fast machine trains the 40 steps within the default 5 s between looks).
SHORT = (*SMOKE, "--set=train.num_train_steps=40", "--set=train.eval_every_steps=5",
         "--poll_s=0.5")


def _launch(*flags, **popen):
  return subprocess.run([sys.executable, "-m", "launch", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=900, **popen)


def _trained_with_its_values(workdir, trial) -> bool:
  """Whether the run in `workdir` was last launched (its trial.json) with every value
  the study holds for `trial`."""
  overrides = json.loads((workdir / "trial.json").read_text())["overrides"]
  return bool(trial.params) and all(
      overrides.get(path) == sweep.format_value(value) for path, value in trial.params.items())


def _states(db) -> dict[int, str]:
  with sqlite3.connect(db) as connection:
    return dict(connection.execute("SELECT number, state FROM trials ORDER BY number"))


def test_the_dry_run_shows_the_space_budget_and_storage_and_creates_nothing(tmp_path):
  experiment = _experiment(tmp_path)
  out = _launch(f"--experiment={experiment}", f"--root={tmp_path / 'runs'}", "--dry_run")
  assert out.returncode == 0, out.stderr[-2000:]
  assert ("# search: 4 trials by tpe (seed 0), pruner successive_halving, first rung at "
          "evaluation 1, keeping 1 in 3; minimize eval/loss") in out.stdout
  url = f"sqlite:///{tmp_path / 'runs' / 'tiny_search' / 'study.db'}"
  assert f"# tiny_search's study: {url} (the default)" in out.stdout.splitlines()
  assert out.stdout.count(url) == 1, out.stdout  # Said once.
  assert "#   optimizer.learning_rate_multiplier: log-uniform float in [0.01, 10.0]" in out.stdout
  assert "--config.model.dropout_rate=VALUE" in out.stdout
  assert not (tmp_path / "runs").exists()


def test_a_searchs_fixed_values_reach_every_trial_beside_the_drawn_ones(tmp_path):
  experiment = sweep.load_experiment(str(_experiment(
      tmp_path, fixed='{"train.eval_every_steps": 100, "model.dtype": "bfloat16"}')))
  run = search.trial_run(experiment, str(tmp_path), [], False, "trial000",
                         {"model.dropout_rate": 0.2})
  assert [f for f in run.args if f.startswith("--config.")] == [
      "--config.model.dropout_rate=0.2", "--config.model.dtype=bfloat16",
      "--config.train.eval_every_steps=100"]
  assert "#   train.eval_every_steps: 100 (fixed)" in search.describe(experiment)


BAD_SEARCHES = [
    ({"space": '{"model.dropout_rat": search.uniform(0.0, 0.3)}'},
     'SEARCH space, at its low end: --config.model.dropout_rat: dropout_rat Did you mean '
     '"dropout_rate"'),
    ({"space": '{"model.dropout_rate": search.uniform(0.0, 1.5)}'},
     "SEARCH space, at its high end: config.model.dropout_rate=1.5 is invalid: expected a "
     "rate in [0, 1)"),
    ({"space": '{"model.dropout_rate": search.uniform(0.3, 0.1)}'},
     "SEARCH space: model.dropout_rate: low 0.3 is above high 0.1"),
    ({"space": '{"optimizer.learning_rate_multiplier": search.log_uniform(0.0, 1.0)}'},
     "SEARCH space: optimizer.learning_rate_multiplier: a log range must be above 0, and "
     "this one starts at 0.0"),
    ({"metric": '"eval/blue"'},
     "SEARCH metric='eval/blue': the runs log no such held-out metric; valid: eval/loss"),
    ({"metric": '"eval/bleu"'},
     "SEARCH metric='eval/bleu' is computed by translating, and these runs translate only "
     "at the end (train.bleu_every_steps=0)"),
    ({"pruner": '"asha"'},
     "SEARCH pruner='asha'; valid: successive_halving, median, hyperband, none"),
    ({"sampler_options": '{"n_startup": 5}'},
     "SEARCH sampler_options: 'n_startup' is not a setting of the tpe sampler; valid: "
     "consider_endpoints, "),
    ({"sampler": '"gp"', "sampler_options": '{"multivariate": True}'},
     "SEARCH sampler_options: 'multivariate' is not a setting of the gp sampler; valid: "),
    ({"sampler": '"random"', "sampler_options": '{"seed": 3}'},
     "SEARCH sampler_options: 'seed' is not a setting of the random sampler; valid: "
     "(none)"),
    ({"first_rung": "0"}, "SEARCH first_rung=0: at least 1 (evaluations)"),
    ({"space": '{"model.dropout_rate": search.uniform(0.2, 0.3)}',
      "start_from_config": "True"},
     "SEARCH start_from_config: the config's model.dropout_rate=0.1 is outside the SEARCH "
     "space of "),
    ({"reduction_factor": "1"}, "SEARCH reduction_factor=1: at least 2"),
    ({"fixed": '{"model.dropout_rate": 0.1}'},
     "SEARCH fixed: model.dropout_rate is also in the space (a field is either searched "
     "or fixed)"),
    ({"fixed": '{"train.eval_every_step": 100}'},
     'SEARCH space, at its low end: --config.train.eval_every_step: eval_every_step Did '
     'you mean "eval_every_steps"'),
]


@pytest.fixture(scope="module")
def bad_search_outcomes(tmp_path_factory) -> list[tuple[int, str, bool]]:
  """Each search of BAD_SEARCHES launched on the smoke config (so that one let through
  trains for seconds, not minutes), forked from one imported launcher: (exit code,
  stderr, whether its --root was made)."""
  tmp = tmp_path_factory.mktemp("bad_searches")
  argvs = []
  for i, (change, _) in enumerate(BAD_SEARCHES):
    (tmp / str(i)).mkdir()
    argvs.append([f"--experiment={_experiment(tmp / str(i), **change)}", *SMOKE,
                  f"--root={tmp / str(i) / 'runs'}"])
  outcomes = run_commands(argvs, tmp, module="launch.__main__")
  return [(code, err, (tmp / str(i) / "runs").exists())
          for i, (code, err) in enumerate(outcomes)]


@pytest.mark.parametrize("change, message", BAD_SEARCHES)
def test_a_bad_search_is_refused_in_one_line_before_any_study_exists(
    bad_search_outcomes, change, message):
  code, err, made_root = bad_search_outcomes[BAD_SEARCHES.index((change, message))]
  assert code == 2, err[-2000:]
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], err[-2000:]
  assert not made_root


@pytest.mark.parametrize("target", ["local", "slurm"])
def test_a_storage_that_cannot_be_opened_is_refused_before_anything_trains(tmp_path, target):
  """Here before a trial trains; on SLURM before anything is submitted (a stand-in
  sbatch that records its calls); the URL's password (in $TRANSFORMER_JAX_STORAGE)
  masked in the one line."""
  blocker = tmp_path / "file"
  blocker.write_text("")
  experiment = _experiment(tmp_path)
  (tmp_path / "bin").mkdir()
  (tmp_path / "bin" / "sbatch").write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/sbatch\n")
  (tmp_path / "bin" / "sbatch").chmod(0o755)
  env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}
  for url, shown in ((f"sqlite:///{blocker}/study.db",) * 2,  # A "folder" that is a file.
                     ("postgresql://someone:Pa55w0rd@localhost:1/nodb",
                      "postgresql://someone:***@localhost:1/nodb")):
    out = _launch(f"--experiment={experiment}", f"--root={tmp_path / 'runs'}",
                  f"--target={target}", "--noship", f"--repo_dir={ROOT}",
                  env={**env, study_lib.STORAGE_ENV: url})
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: --storage={shown}: cannot open the study there"), out.stderr[-2000:]
    assert "Pa55w0rd" not in out.stdout + out.stderr
  assert not (tmp_path / "runs" / "tiny_search" / "trial000").exists()
  assert not (tmp_path / "sbatch").exists()


@pytest.mark.parametrize("where", ["url", "PGPASSWORD"])
def test_a_slurm_search_refuses_a_password_its_tasks_could_not_read(tmp_path, where):
  """SLURM stores a job's environment, so the password stays out of it (in the URL or
  in $PGPASSWORD): without a ~/.pgpass ($PGPASSFILE) for the tasks to read it from, one
  line says where it goes."""
  url, secret = ("postgresql://u:Pa55w0rd@host/db", {}) if where == "url" else (
      "postgresql://u@host/db", {"PGPASSWORD": "Pa55w0rd"})
  out = _launch(f"--experiment={_experiment(tmp_path)}", f"--root={tmp_path / 'runs'}",
                "--target=slurm", "--dry_run", env={
                    **os.environ, study_lib.STORAGE_ENV: url, **secret,
                    "PGPASSFILE": str(tmp_path / "pgpass")})
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert out.returncode == 2 and len(errors) == 1, out.stderr[-2000:]
  assert errors[0] == (
      "error: the study's password cannot travel to the SLURM tasks (SLURM stores a job's "
      f"environment), and there is no {tmp_path / 'pgpass'} for them to read it from: put "
      "it there (HOST:PORT:DATABASE:USER:PASSWORD, chmod 600)")
  assert "Pa55w0rd" not in out.stdout + out.stderr
  assert out.stdout.splitlines()[0] == (f"# tiny_search's study: {study_lib.masked(url)} "
                                        "($TRANSFORMER_JAX_STORAGE)")
  assert study_lib.masked(url) in ("postgresql://u:***@host/db", "postgresql://u@host/db")


@pytest.mark.parametrize("url", ["postgresql://u:Pa55w0rd@host:5432/db?sslmode=require",
                                 "postgresql://u@host/db?password=Pa55w0rd",
                                 "postgresql://u:Pa55w0rd@@host/db",
                                 "postgresql://u:Pa5%40w0rd@host/db"])
def test_a_password_anywhere_in_the_url_is_found_and_never_shown_or_passed_on(url):
  """In the URL's password, in libpq's password= parameter, with an @ in it (escaped or
  not): found (so that --storage refuses it), masked in what is shown, left out of what
  a SLURM job is given; the rest of the URL kept."""
  secret = study_lib.password_of(url)
  assert secret and secret.startswith("Pa5"), secret
  for shown in (study_lib.masked(url), study_lib.without_password(url)):
    assert "Pa5" not in shown and "w0rd" not in shown and shown.startswith("postgresql://u"), shown
    assert "host" in shown and shown.endswith(url.rpartition("/")[2].replace(
        "?password=Pa55w0rd", "?password=***" if "***" in shown else "")), shown


def test_a_study_refuses_a_changed_search_in_one_line_and_changes_nothing(tmp_path):
  """What the trials are is stored in the study when it is made (SEARCH, config, code);
  a relaunch with another metric (and so direction), another choice list, another
  fixed value, another --set or other code exits 2 naming the difference, with the
  study as it was; --allow_search_change goes on, storing the new one."""
  from launch import pack
  url = f"sqlite:///{tmp_path / 'study.db'}"
  first = sweep.load_experiment(str(_experiment(tmp_path, space=(
      '{"model.dropout_rate": search.choice(0.0, 0.1)}'))))
  smoke = [("train.max_length_buckets", "1")]  # SMOKE's --set.
  study = study_lib.open_study(first, url, code=pack.fingerprint(ROOT),
                               config=search.trials_config(first, "runs", smoke, True))
  study.tell(study.ask(first.search.distributions()), 1.0)
  here = pack.fingerprint(ROOT)  # The code the launches below run.
  for folder, options, flags, code, difference in (
      ("metric", {"metric": '"eval/accuracy"',
                  "space": '{"model.dropout_rate": search.choice(0.0, 0.1)}'}, (), here,
       "SEARCH metric 'eval/loss' -> 'eval/accuracy'; SEARCH direction 'minimize' -> "
       "'maximize'; launch with --allow_search_change to go on"),
      ("choices", {"space": '{"model.dropout_rate": search.choice(0.0, 0.2)}'}, (), here,
       "SEARCH space model.dropout_rate: one of [0.0, 0.1] -> one of [0.0, 0.2]; launch "
       "with --allow_search_change to go on"),
      # Another fixed value and another --set, with the study's trials run by other code.
      ("fixed", {"space": '{"model.dropout_rate": search.choice(0.0, 0.1)}',
                 "fixed": '{"train.eval_every_steps": 100}'},
       ("--set=optimizer.warmup_steps=7",), "0123456789ab",
       "SEARCH fixed train.eval_every_steps: None -> 100; config optimizer.warmup_steps: "
       "10 -> 7; config train.eval_every_steps: 10 -> 100; code 0123456789ab -> "
       f"{here}; launch with --allow_code_change and --allow_search_change to go on")):
    study.set_user_attr("code", code)
    stored = dict(study.user_attrs)
    (tmp_path / folder).mkdir()
    changed = _experiment(tmp_path / folder, **options)
    out = _launch(f"--experiment={changed}", f"--root={tmp_path / 'runs'}",
                  f"--storage={url}", *SMOKE, *flags)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "the search differs from the one study 'tiny_search'" in \
        errors[0] and difference in errors[0], errors
    again = study_lib.open_study(first, url, create=False)
    assert len(again.trials) == 1 and dict(again.user_attrs) == stored
  assert study_lib.open_study(first, url, code=here, allow_code_change=True).user_attrs[
      "code"] == here
  changed = sweep.load_experiment(str(tmp_path / "metric" / "tiny_search.py"))
  assert study_lib.open_study(changed, url, allow_change=True).user_attrs["search"][
      "metric"] == "eval/accuracy"
  assert study_lib.open_study(changed, url).user_attrs["search"]["metric"] == "eval/accuracy"
  # A setting added to Search since a study was made is no change.
  older = {k: v for k, v in search_settings(changed).items() if k != "trial_value"}
  study_lib.open_study(changed, url).set_user_attr("search", older)
  assert study_lib.open_study(changed, url).user_attrs["search"] == search_settings(changed)


_MADE_WITH = dict(space={"model.dropout_rate": search.uniform(0.0, 0.3),
                        "train.batch_size": search.choice(8.0, 16.0),
                        "optimizer.warmup_steps": search.integer(10, 100, log=True)},
                 pruner="median")


@pytest.mark.parametrize("options, change", [
    # The same meaning, spelled otherwise: no change.
    (dict(space={"model.dropout_rate": search.uniform(0, 0.3),
                 "train.batch_size": search.choice(8, 16),
                 "optimizer.warmup_steps": search.integer(10.0, 100, log=True)}), None),
    (dict(sampler_options={"n_startup_trials": 10, "constant_liar": True}), None),
    (dict(reduction_factor=2), None),  # The median rule has no reduction factor.
    # Another meaning: refused.
    (dict(space={**_MADE_WITH["space"], "model.dropout_rate": search.uniform(0.0, 0.4)}),
     "SEARCH space model.dropout_rate: uniform float in [0.0, 0.3] -> uniform float in "
     "[0.0, 0.4]"),
    (dict(space={**_MADE_WITH["space"], "optimizer.warmup_steps": search.integer(10, 100)}),
     "SEARCH space optimizer.warmup_steps: log-uniform integer in [10, 100] -> uniform "
     "integer in [10, 100]"),
    (dict(space={**_MADE_WITH["space"], "model.label_smoothing": search.uniform(0.0, 0.2)}),
     "SEARCH space model.label_smoothing: (none) -> uniform float in [0.0, 0.2]"),
    (dict(sampler_options={"n_startup_trials": 5}), "SEARCH sampler n_startup_trials: 10 -> 5"),
    (dict(first_rung=2), "SEARCH pruner n_warmup_steps: 1 -> 2"),
    (dict(pruner="successive_halving"),
     "SEARCH pruner name: 'MedianPruner' -> 'SuccessiveHalvingPruner'"),
])
def test_a_study_compares_the_search_by_its_meaning_not_its_spelling(tmp_path, capsys,
                                                                     options, change):
  """Distributions by value (0 is 0.0), Optuna's defaults filled in (a sampler setting
  spelled out at its default, a setting the pruner does not have: no change); another
  meaning exits 2 in one line naming it, the study untouched."""
  made = sweep.Experiment("s", "s.py", "configs/transformer.py:numbers", (), "",
                          search.Search(**_MADE_WITH))
  url = f"sqlite:///{tmp_path / 'study.db'}"
  stored = dict(study_lib.open_study(made, url).user_attrs)
  again = sweep.Experiment("s", "s.py", "configs/transformer.py:numbers", (), "",
                           search.Search(**{**_MADE_WITH, **options}))
  capsys.readouterr()
  if change is None:
    study_lib.open_study(again, url)
  else:
    with pytest.raises(SystemExit) as refused:
      study_lib.open_study(again, url)
    error = capsys.readouterr().err
    assert refused.value.code == 2 and error.count("\n") == 1 and change in error, error
  assert dict(study_lib.open_study(made, url, create=False).user_attrs) == stored


def search_settings(experiment) -> dict:
  """The SEARCH as its study stores it (JSON)."""
  return json.loads(json.dumps(experiment.search.settings()))


def test_launch_and_results_find_the_study_where_the_search_put_it(tmp_path, monkeypatch,
                                                                   capsys):
  """One rule, said on the first line: --storage first, then the storage the search was
  launched with (ROOT/EXPERIMENT/storage.json, kept without its password: taken from
  $TRANSFORMER_JAX_STORAGE when that names the same place), then
  $TRANSFORMER_JAX_STORAGE, then SQLite in the experiment's folder. A password in
  --storage is refused in one line that says where it goes."""
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  root = str(tmp_path / "runs")
  default = f"sqlite:///{tmp_path}/runs/tiny_search/study.db"
  journal, there = f"journal:{tmp_path / 'elsewhere.journal'}", "postgresql://u@host/db"

  def resolve(given=None, env=None):
    monkeypatch.delenv(study_lib.STORAGE_ENV, raising=False)
    if env:
      monkeypatch.setenv(study_lib.STORAGE_ENV, env)
    capsys.readouterr()
    url = study_lib.resolve_storage(experiment, root, False, given)
    return url, capsys.readouterr().out

  assert resolve() == (default, f"# tiny_search's study: {default} (the default)\n")
  assert resolve(env=there)[0] == there
  assert resolve("sqlite:///x.db", env=there)[0] == "sqlite:///x.db"
  study_lib.open_study(experiment, journal)
  study_lib.remember_storage(experiment, root, False, journal)
  record = tmp_path / "runs" / "tiny_search" / "storage.json"
  for env in (None, there):  # The record wins over the environment...
    url, said = resolve(env=env)
    assert url == journal and said == (f"# tiny_search's study: {journal} (where it was "
                                       f"launched: {record})\n"), said
  assert resolve("sqlite:///x.db", env=there)[0] == "sqlite:///x.db"  # ...--storage over both.
  report = subprocess.run([sys.executable, "-m", "launch.results",
                           f"--experiment={tmp_path / 'tiny_search.py'}", f"--root={root}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, study_lib.STORAGE_ENV: there})
  assert report.returncode == 0, report.stderr[-2000:]
  assert report.stdout.splitlines()[:2] == [
      f"# tiny_search's study: {journal} (where it was launched: {record})",
      f"tiny_search: 0 trials in {tmp_path}/runs/tiny_search, best eval/loss first (the "
      "study's value)"], report.stdout
  # A study with a password: the record keeps the URL without it, and the environment's
  # URL for the same place gives it.
  study_lib.remember_storage(experiment, root, False, "postgresql://u:Pa55@host/db")
  assert record.read_text() == '{"storage": "postgresql://u@host/db"}'
  assert resolve(env="postgresql://u:Pa55@host/db") == (
      "postgresql://u:Pa55@host/db", "# tiny_search's study: postgresql://u:***@host/db "
      f"({record}, with $TRANSFORMER_JAX_STORAGE's password)\n")
  assert resolve(env="postgresql://u:Pa55@other/db")[0] == "postgresql://u@host/db"
  with pytest.raises(SystemExit) as refused:
    resolve("postgresql://u:Pa55@host/db")
  error = capsys.readouterr().err
  assert refused.value.code == 2 and error.count("\n") == 1 and "Pa55" not in error, error
  assert error.startswith("error: --storage=postgresql://u:***@host/db: a password on the "
                          "command line stays in `ps` and the shell's history: give the URL "
                          "without it and the password in ~/.pgpass"), error


def test_a_traceback_and_a_trials_processes_show_no_password(tmp_path, monkeypatch, capsys):
  """Once a command knows the study's URL, a traceback shows its password as ***; the
  processes a launcher starts to train get neither $TRANSFORMER_JAX_STORAGE nor
  $PGPASSWORD."""
  from launch.targets import local
  url = "postgresql://u:Pa55w0rd@host/db"
  monkeypatch.setenv(study_lib.STORAGE_ENV, url)
  monkeypatch.setenv("PGPASSWORD", "Pa55w0rd")
  monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # (Restored after.)
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  assert study_lib.resolve_storage(experiment, str(tmp_path), False, None) == url
  try:
    raise ConnectionError(f"cannot reach {url} (password Pa55w0rd)")
  except ConnectionError:
    sys.excepthook(*sys.exc_info())
  shown = capsys.readouterr()
  assert "ConnectionError: cannot reach postgresql://u:***@host/db (password ***)" in \
      shown.err and "Pa55w0rd" not in shown.out + shown.err, shown
  log = tmp_path / "trial.log"
  codes, _ = local._run_together(
      [[sys.executable, "-c", "import os; print(sorted(os.environ.items()))"]] * 2, str(log))
  assert codes == [0, 0] and log.read_text().count("PATH") >= 2  # Both processes wrote.
  assert "Pa55w0rd" not in log.read_text() + capsys.readouterr().out


def test_a_warm_start_that_finds_no_finished_trial_says_so_in_one_line(tmp_path, capsys):
  """From a grid with no finished trial, or from a search whose study holds none (its
  study named first, by the one rule): one line each, nothing added."""
  from launch import warm_start
  grid = tmp_path / "grid.py"
  grid.write_text('"""A grid."""\nfrom launch import sweep\n'
                  'CONFIG = "configs/transformer.py:numbers"\n'
                  'def trials():\n  return sweep.grid({"model.dropout_rate": [0.0, 0.05]})\n')
  (tmp_path / "earlier").mkdir()
  earlier = _experiment(tmp_path / "earlier", name="earlier")
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  root = str(tmp_path / "runs")
  capsys.readouterr()
  assert warm_start.finished_trials(experiment, str(grid), root, False) == []
  assert capsys.readouterr().out == (
      f"# --warm_start={grid}: no finished trial in {root}/grid: nothing added\n")
  assert warm_start.finished_trials(experiment, str(earlier), root, False) == []
  assert capsys.readouterr().out.splitlines() == [
      f"# earlier's study: sqlite:///{root}/earlier/study.db (the default)",
      f"# --warm_start={earlier}: no finished trial in its study: nothing added"]


def test_the_direction_follows_the_metric():
  space = {"model.dropout_rate": search.uniform(0.0, 0.3)}
  assert search.Search(space, metric="eval/loss").direction == "minimize"
  assert search.Search(space, metric="eval/nll").direction == "minimize"
  assert search.Search(space, metric="eval/accuracy").direction == "maximize"
  assert search.Search(space, metric="eval/bleu").direction == "maximize"


@pytest.mark.slow
def test_a_search_prunes_spends_its_budget_once_and_reports_best_first(tmp_path):
  """4 trials of 40 steps, some with a learning rate that moves nothing (their held-out
  loss stays the first one): such a trial that meets a learning one at an evaluation is
  pruned there (successive halving), its step recorded, and a relaunch neither trains it
  again nor samples more; launch.results lists the trials best first, with the plots."""
  experiment = _experiment(tmp_path, space=(
      '{"optimizer.learning_rate_multiplier": search.choice(1.0, 1e-9), '
      '"model.dropout_rate": search.uniform(0.0, 0.3)}'))
  root = tmp_path / "runs"
  out = _launch(f"--experiment={experiment}", f"--root={root}", *SHORT)
  assert out.returncode == 0, out.stderr[-3000:]
  db = root / "tiny_search_smoke" / "study.db"
  states = _states(db)
  assert sorted(states) == [0, 1, 2, 3]
  assert set(states.values()) <= {"COMPLETE", "PRUNED"}
  learning_before = False
  for number, state in states.items():
    workdir = root / "tiny_search_smoke" / f"trial{number:03d}"
    multiplier = float(json.loads((workdir / "trial.json").read_text())["overrides"][
        "optimizer.learning_rate_multiplier"])
    if multiplier == 1e-9 and learning_before:
      assert state == "PRUNED", (number, states)
    learning_before |= multiplier == 1.0
    assert (workdir / "pruned.json").exists() == (state == "PRUNED")
    if state == "PRUNED":  # At an evaluation before the last, counted in evaluations.
      pruned = json.loads((workdir / "pruned.json").read_text())
      assert pruned["step"] < 40 and pruned["evaluation"] * 5 == pruned["step"], pruned
  assert "PRUNED" in states.values(), states
  again = _launch(f"--experiment={experiment}", f"--root={root}", *SHORT)
  assert again.returncode == 0 and "# trial" not in again.stdout, again.stdout[-2000:]
  assert _states(db) == states

  png = tmp_path / "curves.png"
  report = subprocess.run(
      [sys.executable, "-m", "launch.results", f"--experiment={experiment}",
       f"--root={root}", "--smoke", "--sort=eval/loss", f"--plot={png}",
       f"--csv={tmp_path / 'table.csv'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert report.returncode == 0, report.stderr[-3000:]
  study = study_lib.open_study(sweep.load_experiment(str(experiment)),
                            study_lib.default_storage(sweep.load_experiment(str(experiment)),
                                                   str(root), True), create=False)
  rows = results.collect(sweep.load_experiment(str(experiment)), str(root), "eval/loss",
                         True, study)
  complete = [r["value"] for r in rows if r["status"] == "complete"]
  assert complete and complete == sorted(complete)
  assert "\nbudget: 4 of 4 trials, " in report.stdout and all(  # Each trial's time, here.
      t.user_attrs["device_seconds"] > 0 for t in study.get_trials()), report.stdout
  assert rows[0]["status"] == "complete" and rows[0]["value"] == study.best_value
  for plot in ("history", "intermediate", "parallel", "importances"):
    assert (tmp_path / f"curves_{plot}.png").read_bytes()[:4] == b"\x89PNG", plot
  params = list(csv.DictReader((tmp_path / "table.csv").read_text().splitlines()))
  assert [(r["trial"], r["model.dropout_rate"]) for r in params] == [
      (r["trial"], str(r["_params"]["model.dropout_rate"])) for r in rows]

  # The best trial's command, as launch.results prints it and best.txt has it, trains
  # it again: the same config in a workdir of its own.
  best = (root / "tiny_search_smoke" / "best.txt").read_text().splitlines()
  assert best[0] == f"# best: {rows[0]['trial']}, eval/loss {rows[0]['value']:.4g}; " \
      "trained again by:" and "\n".join(best) in report.stdout
  command = shlex.split(best[1])
  assert command[:3] == ["python", "-m", "transformer_jax.main"]
  again = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
  assert again.returncode == 0, again.stderr[-2000:]
  first = root / "tiny_search_smoke" / rows[0]["trial"]
  config = lambda workdir: {k: v for k, v in json.loads(
      (workdir / "config.json").read_text()).items() if k != "workdir"}
  assert config(first.parent / f"{first.name}_again") == config(first)


@pytest.mark.slow
def test_a_launcher_killed_mid_study_resumes_its_trial_with_the_same_values(tmp_path):
  """kill -9 of the launcher and its trial while trial000 trains: the relaunch resumes
  trial000 from its checkpoint with the values it had, samples no extra trial (the
  budget is that one trial), and finishes it."""
  experiment = _experiment(tmp_path, trials="1", pruner='"none"')
  root = tmp_path / "runs"
  long = (*SMOKE, "--set=train.num_train_steps=200", "--set=train.eval_every_steps=100",
          "--set=train.checkpoint_every_steps=20")
  proc = subprocess.Popen([sys.executable, "-m", "launch", f"--experiment={experiment}",
                           f"--root={root}", *long], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
  workdir = root / "tiny_search_smoke" / "trial000"
  deadline = time.time() + 600
  # Two checkpoints: the first is whole (a kill may cut the one being written).
  while time.time() < deadline and len(list((workdir / "checkpoints").glob("[0-9]*"))) < 2:
    time.sleep(0.5)
    assert proc.poll() is None, proc.stdout.read()[-3000:]
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait(timeout=60)
  before = json.loads((workdir / "trial.json").read_text())["overrides"]
  db = root / "tiny_search_smoke" / "study.db"
  assert _states(db) == {0: "RUNNING"}
  out = _launch(f"--experiment={experiment}", f"--root={root}", *long)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "trial000: left running by a launcher that stopped" in out.stdout
  assert json.loads((workdir / "trial.json").read_text())["overrides"] == before
  assert "resumed from checkpoint at step" in (workdir / "launch.log").read_text()
  assert _states(db) == {0: "COMPLETE"}


@pytest.mark.parametrize("storage", ["sqlite", "journal"])
def test_two_handles_on_one_storage_share_one_study(tmp_path, storage):
  """SQLite, or a journal file on a shared filesystem: a second launcher's handle sees
  the trials the first asked for, with their values, and samples after them."""
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  url = (f"sqlite:///{tmp_path / 'study.db'}" if storage == "sqlite"
         else f"journal:{tmp_path / 'study.log'}")
  first, second = study_lib.open_study(experiment, url), study_lib.open_study(experiment, url)
  asked = first.ask(experiment.search.distributions())
  seen = second.get_trials(deepcopy=False)
  assert [(t.number, t.params) for t in seen] == [(asked.number, asked.params)]
  assert second.ask(experiment.search.distributions()).number == asked.number + 1
  assert study_lib.open_study(experiment, url, create=False).direction.name == "MINIMIZE"


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
def test_two_launchers_with_their_own_roots_share_a_study_and_train_each_trial_once(
    tmp_path, storage):
  """Two launchers started at once on one study, each with a --root of its own, as two
  machines that share no folder would (the study: SQLite in a shared folder; a real
  PostgreSQL server, pgserver's, from PyPI): the budget's 4 trials, each trained by
  one of them alone with the values the study holds for it, and both end well."""
  server = None
  if storage == "postgresql":
    import pgserver
    server = pgserver.get_server(str(tmp_path / "postgres"), cleanup_mode="stop")
  try:
    url = server.get_uri() if server else f"sqlite:///{tmp_path / 'shared' / 'study.db'}"
    (tmp_path / "shared").mkdir()
    experiment = _experiment(tmp_path, pruner='"none"')
    roots = [tmp_path / "A", tmp_path / "B"]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "launch", f"--experiment={experiment}", f"--root={root}",
         f"--storage={url}", *SMOKE, "--set=train.num_train_steps=20"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for root in roots]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
    study = study_lib.open_study(sweep.load_experiment(str(experiment)), url, create=False)
    trials = study.get_trials()
  finally:
    if server:
      server.cleanup()
  assert sorted((t.number, t.state.name) for t in trials) == [(n, "COMPLETE") for n in range(4)]
  assert not any("resuming" in o for o in outputs), outputs  # No live trial taken over.
  trained = [o.count("# trial") for o in outputs]
  assert sum(trained) == 4 and all(trained), outputs  # Both trained; none twice.
  for trial in trials:
    [workdir] = [root / "tiny_search_smoke" / trial.user_attrs["name"] for root in roots
                 if (root / "tiny_search_smoke" / trial.user_attrs["name"]).exists()]
    assert trial.user_attrs["workdir"] == str(workdir)
    assert (workdir / "launch.log").read_text().count("step 1 starts") == 1
    assert _trained_with_its_values(workdir, trial)


def test_the_slurm_dry_run_is_an_array_of_launchers_sharing_a_journal(tmp_path):
  """One array task per trial of the budget (--max_running at once), each a launcher on
  one node taking trials from one study: by default a journal file on the shared
  filesystem; --nodes is refused (the search's trial_devices sizes its trials)."""
  root = tmp_path / "runs"
  out = _launch("--experiment=experiments/numbers_search.py", "--target=slurm",
                "--dry_run", f"--root={root}", "--gpus_per_node=8", "--max_running=4",
                "--set=train.seed=3")
  assert out.returncode == 0, out.stderr[-2000:]
  sbatch = dict(re.findall(r"^#SBATCH --([\w-]+)=(.*)$", out.stdout, re.M))
  assert (sbatch["array"], sbatch["nodes"], sbatch["gpus-per-node"]) == ("0-15%4", "1", "8")
  journal = f"journal:{root}/numbers_search/study.journal"
  assert f"# numbers_search's study: {journal} (the default)" in out.stdout.splitlines()
  [command] = [line for line in out.stdout.splitlines() if line.endswith(" & RUNS+=($!)")]
  assert shlex.split(command.removesuffix(" & RUNS+=($!)")) == [
      "python", "-m", "launch", "--experiment=experiments/numbers_search.py",
      f"--root={root}", f"--storage={journal}", "--target=local", "--set=train.seed=3"]
  assert not root.exists()
  wide = _launch("--experiment=experiments/numbers_search.py", "--target=slurm",
                 "--dry_run", f"--root={root}", "--nodes=2")
  assert wide.returncode == 2 and "--nodes=2: a search sizes its trials by its SEARCH's " \
      "trial_devices (e.g. trial_devices=16 with --gpus_per_node=8: 2 nodes a" in wide.stderr


@pytest.mark.slow
def test_two_slurm_tasks_of_a_search_share_its_journal_and_train_each_trial_once(
    tmp_path, monkeypatch):
  """The sbatch script itself, as the array's tasks 0 and 1 run it at once (`python`
  and `scontrol` stand-ins on PATH): 2 trials, each trained once, both tasks end well."""
  code = tmp_path / "code"
  (code / "experiments").mkdir(parents=True)
  for name in ("launch", "transformer_jax", "configs", "pyproject.toml"):
    (code / name).symlink_to(os.path.join(ROOT, name))
  _experiment(code / "experiments", trials="2", pruner='"none"')
  monkeypatch.chdir(code)
  experiment = sweep.load_experiment("experiments/tiny_search.py")
  root, journal = tmp_path / "runs", f"journal:{tmp_path / 'study.journal'}"
  script = slurm.search_script(experiment, str(root), journal,
                               [("train.num_train_steps", "20")], True, str(code), 1, None)
  (tmp_path / "sbatch.sh").write_text(script)
  (tmp_path / "bin").mkdir()
  (tmp_path / "bin" / "python").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
  (tmp_path / "bin" / "python").chmod(0o755)
  env = {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}",
         "SLURM_ARRAY_JOB_ID": "77"}
  tasks = [subprocess.Popen(["bash", str(tmp_path / "sbatch.sh")],
                            env={**env, "SLURM_ARRAY_TASK_ID": str(i)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(2)]
  outputs = [task.communicate(timeout=900)[0] for task in tasks]
  assert [task.returncode for task in tasks] == [0, 0], [o[-2000:] for o in outputs]
  study = study_lib.open_study(experiment, journal, create=False)
  assert sorted((t.number, t.state.name) for t in study.get_trials()) == [
      (0, "COMPLETE"), (1, "COMPLETE")]
  for number in range(2):
    log = (root / "tiny_search_smoke" / f"trial{number:03d}" / "launch.log").read_text()
    assert log.count("step 1 starts") == 1, log[-2000:]


def test_a_failed_trial_is_retried_in_its_own_workdir_then_given_up(tmp_path):
  """A run that fails (here: its data folder is missing) is trained again, as the same
  trial with the same values, at most `retries` times, not counted against the budget;
  then it is FAIL with its reason and the launcher exits 1."""
  experiment = _experiment(tmp_path, trials="1", retries="1")
  experiment.write_text(experiment.read_text().replace("transformer.py:numbers",
                                                       "transformer.py:multi30k"))
  root = tmp_path / "runs"
  out = _launch(f"--experiment={experiment}", f"--root={root}", "--smoke",
                f"--set=data.manual_dir={tmp_path / 'missing'}")
  assert out.returncode == 1, out.stderr[-3000:]
  assert "# trial000: failed (its run failed); trying it again (retry 1 of 1)" in out.stderr
  assert "# trial000: failed (its run failed), 2 times: given up" in out.stderr
  study = study_lib.open_study(sweep.load_experiment(str(experiment)),
                            f"sqlite:///{root / 'tiny_search_smoke' / 'study.db'}",
                            create=False)
  [trial] = study.get_trials()
  assert (trial.number, trial.state.name, trial.user_attrs["failures"]) == (0, "FAIL", 2)
  assert trial.user_attrs["name"] == "trial000"
  assert trial.user_attrs["failure"].startswith("its run failed (see ")
  assert _trained_with_its_values(root / "tiny_search_smoke" / "trial000", trial)


def test_results_of_a_search_not_launched_yet_say_so_and_write_nothing(tmp_path):
  experiment = _experiment(tmp_path)
  out = subprocess.run([sys.executable, "-m", "launch.results", f"--experiment={experiment}",
                        f"--root={tmp_path / 'runs'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  study = f"sqlite:///{tmp_path}/runs/tiny_search/study.db"
  assert out.stdout.splitlines() == [
      f"# tiny_search's study: {study} (the default)",
      f"tiny_search: no study in {study} yet: launch the search first"]
  assert not (tmp_path / "runs").exists()


def test_launchers_opening_a_new_postgresql_database_at_once_all_get_the_study(tmp_path):
  """Six launchers at once on an empty PostgreSQL database: each creates Optuna's tables
  and the study if missing; they race (a unique-key violation) and all must still
  open the one study (without retrying, 4 of 6 failed here)."""
  import pgserver
  server = pgserver.get_server(str(tmp_path / "postgres"), cleanup_mode="stop")
  try:
    code = ("from launch import study as study_lib, sweep\n"
            f"e = sweep.load_experiment({str(_experiment(tmp_path))!r})\n"
            f"print('opened', study_lib.open_study(e, {server.get_uri()!r}).study_name)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for _ in range(6)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [o.strip().splitlines()[-1] for o in outputs] == ["opened tiny_search"] * 6, outputs
  finally:
    server.cleanup()


def _reported(tmp_path, study, spec, name, losses, every=10, steps=200):
  """Reports a trial through search.Reporter as a launcher does, its run evaluated
  every `every` of `steps` steps with held-out losses `losses` (event files written at
  once); returns (the Reporter, how it ended)."""
  return _watched(tmp_path, study, spec, name, dict(zip(range(every, steps + 1, every),
                                                        losses)),
                  f"--config.train.eval_every_steps={every}",
                  f"--config.train.num_train_steps={steps}")


def _watched(tmp_path, study, spec, name, values: dict, *flags, trained=True):
  """Reports a trial of the numbers config with `flags` through search.Reporter, its
  event files holding spec.metric's `values` by step, its run ended (`trained` to the
  end, or not: exit.json says how); returns (the Reporter, how it ended)."""
  from transformer_jax import summaries
  workdir = tmp_path / name
  run = trials_lib.Run(sweep.Trial(name, ()), str(workdir), (
      "--config=configs/transformer.py:numbers", *flags))
  writer = summaries.SummaryWriter(workdir)
  for step, value in values.items():
    writer.write_scalars(step, {spec.metric: value}, log=False)
  writer.close()
  trial = study.ask(spec.distributions())
  trial.set_user_attr("name", name)
  reporter = search.Reporter(study, trial, spec, run)
  reporter.watch()
  return reporter, reporter.end(trained, "")


@pytest.mark.parametrize("metric, every, rungs, brackets", [
    ("eval/bleu", 1000, [1, 3, 9], 3), ("eval/loss", 500, [1, 3, 9, 27], 4)])
def test_rungs_fall_on_the_metrics_own_evaluations_and_brackets_follow_the_config(
    tmp_path, metric, every, rungs, brackets):
  """15,000 steps, the loss pass every 500 and BLEU every 1,000 (as in
  experiments/multi30k_search.py): successive halving with reduction factor 3 judges a
  BLEU trial at its BLEU passes 1, 3 and 9 (the rungs' values, each the pass it was
  recorded at; counted in loss passes they fell at BLEU passes 1, 2 and 5), a loss
  trial at loss passes 1, 3, 9 and 27; Hyperband has a bracket for each power of 3 in
  a full run's evaluations (15 BLEU passes: 3; 30 loss passes: 4), known from the
  config before any trial ends, a diverged one with 2 evaluations included."""
  import optuna
  from transformer_jax.training import run_files
  flags = ("--config.train.num_train_steps=15000", "--config.train.eval_every_steps=500",
           "--config.train.bleu_every_steps=1000")
  spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)},
                       metric=metric)
  study = optuna.create_study(direction=spec.direction)
  # Each evaluation's value is its number: a rung's recorded value says where it fell.
  _watched(tmp_path, study, spec, "t", {step: step / every for step in range(
      every, 15001, every)}, *flags)
  assert sorted(v for k, v in study.trials[0].system_attrs.items()
                if k.startswith("completed_rung_")) == rungs

  spec = dataclasses.replace(spec, pruner="hyperband")
  study = optuna.create_study(direction=spec.direction)
  run_files.record_exit(tmp_path / "diverged", 3, "why")
  reporter, ended = _watched(tmp_path, study, spec, "diverged", {every: 1.0, 2 * every: 1.0},
                             *flags, trained=False)
  assert ended == "diverged" and study.pruner._max_resource == 15000 // every
  _watched(tmp_path, study, spec, "learning", {every: 1.0, 2 * every: 1.0}, *flags)
  assert study.pruner._n_brackets == brackets


@pytest.mark.parametrize("pruner", ["successive_halving", "median", "hyperband"])
def test_the_pruners_count_evaluations_from_the_first_rung_and_never_judge_the_last(
    tmp_path, pruner):
  """The trials report their k-th evaluation as step k (every 10 of 200 training
  steps): a trial far worse than finished ones at every evaluation is kept before the
  first rung (3) and pruned at it (training step 30); with the first rung at the last
  evaluation it trains to the end, as nothing is saved by stopping a run that is done."""
  import optuna
  for first_rung, pruned_step in ((3, 30), (20, None)):
    spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)},
                         pruner=pruner, first_rung=first_rung)
    # Hyperband puts a trial in a bracket by the crc32 of the study's name and the
    # trial's number, and bracket s first prunes at first_rung * 3**s: a fixed name puts
    # every trial here in bracket 0 (an unnamed study gets a random name).
    study = optuna.create_study(study_name="min_steps", direction=spec.direction,
                                pruner=spec.make_pruner(),
                                sampler=optuna.samplers.RandomSampler(seed=0))
    folder = tmp_path / str(first_rung)
    for i in range(6):  # Finished trials that learn.
      _, ended = _reported(folder, study, spec, f"learning{i}",
                           [1.0 / step for step in range(10, 210, 10)])
      assert ended == "done"
    assert sorted(study.trials[0].intermediate_values) == list(range(1, 21))
    reporter, ended = _reported(folder, study, spec, "losing", [10.0] * 20)
    assert reporter.pruned_at == pruned_step, (first_rung, reporter.pruned_at)
    assert ended == ("done" if pruned_step is None else "pruned")
    if pruned_step:
      assert json.loads((folder / "losing" / "pruned.json").read_text())[
          "evaluation"] == first_rung
  assert "first rung at evaluation 20" in search.describe(
      sweep.Experiment("x", "x.py", "c", (), "", search.Search(space=spec.space, first_rung=20)))


# Four launchers' worth of draws: each process takes trials from the study as a launcher
# does (search.next_trial, its hold included) and tells each a value at once.
_DRAWER = """
import json, sys
from launch import search, study as study_lib, sweep, trial_lease
experiment = sweep.load_experiment(sys.argv[1])
study = study_lib.open_study(experiment, sys.argv[2])
drawn, seen = [], trial_lease.Seen()
while (taken := search.next_trial(study, experiment.search, seen, wait=False)):
  trial, claim = taken
  drawn.append((trial.number, trial.params))
  study.tell(trial, sum(float(v) for v in trial.params.values()))
  claim.release()
print(json.dumps(drawn))
"""
_DRAW_SPACE = ('{"optimizer.learning_rate_multiplier": search.log_uniform(0.1, 10.0), '
               '"model.dropout_rate": search.uniform(0.0, 0.3), '
               '"optimizer.warmup_steps": search.integer(10, 100000, log=True)}')


def _draw_at_once(tmp_path, url: str, launchers: int) -> list[list]:
  experiment = _experiment(tmp_path, space=_DRAW_SPACE, trials="16")
  procs = [subprocess.Popen([sys.executable, "-c", _DRAWER, str(experiment), url], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for _ in range(launchers)]
  outputs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0] * launchers, [e[-2000:] for _, e in outputs]
  return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


@pytest.mark.parametrize("storage", ["sqlite", "postgresql"])
def test_launchers_sharing_a_study_never_draw_one_value_twice(tmp_path, storage):
  """Four launchers at once on one study (SQLite; a real PostgreSQL server): the
  budget's 16 trials, each taken by one launcher, with 16 distinct values of every
  field (TPE's first draws are random ones, and every launcher's sampler used to start
  from the same seed: the same values, several times)."""
  server = None
  if storage == "postgresql":
    import pgserver
    server = pgserver.get_server(str(tmp_path / "postgres"), cleanup_mode="stop")
  try:
    url = server.get_uri() if server else f"sqlite:///{tmp_path / 'study.db'}"
    drawn = [d for launcher in _draw_at_once(tmp_path, url, 4) for d in launcher]
  finally:
    if server:
      server.cleanup()
  assert sorted(number for number, _ in drawn) == list(range(16)), drawn
  for path in ("optimizer.learning_rate_multiplier", "model.dropout_rate"):
    assert len({params[path] for _, params in drawn}) == 16, (path, drawn)


def test_a_trials_values_follow_from_the_seed_and_its_number_alone(tmp_path):
  """One launcher from scratch draws what it drew before, trial by trial; a relaunch on
  the same study (a new sampler, as after kill -9) draws new values, never an earlier
  trial's; another seed draws others."""
  def draws(name, seed="0", count=3, url=None):
    experiment = sweep.load_experiment(str(_experiment(
        tmp_path, name=name, space=_DRAW_SPACE, seed=seed, trials="16")))
    study = study_lib.open_study(experiment, url or f"sqlite:///{tmp_path / name}.db")
    out = []
    for _ in range(count):
      trial, claim = search.next_trial(study, experiment.search, trial_lease.Seen())
      out.append(trial.params)
      study.tell(trial, sum(float(v) for v in trial.params.values()))
      claim.release()
    return out

  first = draws("first")
  assert draws("again") == first  # The same study from scratch.
  relaunched = draws("first", url=f"sqlite:///{tmp_path / 'first'}.db")  # Trials 3-5.
  assert not any(params in first for params in relaunched), (first, relaunched)
  other = draws("other", seed="1")
  assert not any(params in first for params in other), (first, other)


def _ended(tmp_path, study, spec, name, code):
  """Ends trial `name` through search.Reporter as a run that exited with `code`
  (exit.json) before writing any metric; returns how it ended."""
  from transformer_jax.training import run_files
  workdir = tmp_path / name
  run = trials_lib.Run(sweep.Trial(name, ()), str(workdir), (
      "--config=configs/transformer.py:numbers",))
  run_files.record_exit(workdir, code, "why")
  trial = study.ask(spec.distributions())
  trial.set_user_attr("name", name)
  return search.Reporter(study, trial, spec, run).end(False, "")


def test_a_diverged_trial_fails_and_is_not_retried_and_a_crash_is(tmp_path):
  """A run that ended with exit 3 (non-finite loss, exit.json) is FAIL in the study,
  as Optuna has a non-finite value (so that no sampler ranks it as a good trial),
  marked diverged and not retried; a run that failed otherwise stays RUNNING, to be
  trained again as itself."""
  import optuna
  spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)}, retries=1)
  study = optuna.create_study(direction=spec.direction)
  ended = {name: _ended(tmp_path, study, spec, name, code)
           for name, code in (("diverged", 3), ("crashed", 1))}
  assert ended == {"diverged": "diverged", "crashed": "retried"}
  diverged, crashed = study.get_trials()
  assert diverged.state.name == "FAIL" and diverged.value is None
  assert diverged.user_attrs["diverged"] == "why" and "failure" not in diverged.user_attrs
  # The crashed one stays RUNNING, to be trained again as itself.
  assert crashed.state.name == "RUNNING" and crashed.user_attrs["failures"] == 1


@pytest.mark.parametrize("sampler", ["tpe", "gp", "random"])
def test_no_sampler_ranks_a_diverged_trial_above_a_finished_or_pruned_one(
    tmp_path, monkeypatch, sampler):
  """The issue's study: one finished trial, nine pruned, one diverged. Asked for the
  next draw, TPE's own split (`_split_trials`) puts no diverged trial in its good
  ("below") group (told as inf and COMPLETE, it went before every pruned one: good =
  [0.8, inf]); the Gaussian process is fitted on the finished trials only; the random
  sampler draws what it draws with a pruned trial in its place."""
  import optuna
  from optuna.samplers._gp import sampler as gp_sampler
  from optuna.samplers._tpe import sampler as tpe_sampler
  spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)},
                       sampler=sampler, pruner="none",
                       sampler_options={} if sampler == "random" else {"n_startup_trials": 1})
  seen = []  # (the good group, the rest) of each draw: TPE's split, the GP's fit.
  if sampler == "tpe":
    split = tpe_sampler._split_trials

    def spied_split(*args):
      seen.append(split(*args))
      return seen[-1]
    monkeypatch.setattr(tpe_sampler, "_split_trials", spied_split)
  if sampler == "gp":
    fit = gp_sampler.GPSampler._sample_relative_impl

    def spied_fit(self, study, completed, *args):
      seen.append((completed, []))
      return fit(self, study, completed, *args)
    monkeypatch.setattr(gp_sampler.GPSampler, "_sample_relative_impl", spied_fit)

  def draw(diverged: bool):
    study = optuna.create_study(direction=spec.direction)
    for i in range(10):
      trial = study.ask(spec.distributions())
      trial.report(0.8 if i == 0 else 2.0 + i, 1)
      if i == 0:
        study.tell(trial, 0.8)
      else:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    if diverged:
      assert _ended(tmp_path, study, spec, "diverged", 3) == "diverged"
    else:  # A pruned trial in its place (the draw is seeded by the trial's number).
      study.tell(study.ask(spec.distributions()), state=optuna.trial.TrialState.PRUNED)
    trial = study.ask()
    search._draw(study, trial, spec)
    return study, trial.params

  study, params = draw(diverged=True)
  diverged = next(t.number for t in study.trials if "diverged" in t.user_attrs)
  assert study.best_trial.number == 0
  if sampler == "random":
    assert params == draw(diverged=False)[1]
    return
  assert seen, "the sampler learned from no trial"
  for good, _ in seen:
    assert good and diverged not in [t.number for t in good], [t.number for t in good]
    if sampler == "gp":  # Fitted on the finished trials alone.
      assert [t.state.name for t in good] == ["COMPLETE"]


@contextlib.contextmanager
def _processes_watched(secret: str):
  """While the block runs, every process's command line and every training process's
  (transformer_jax.main) environment, read ten times a second: the pids of those whose
  command line holds `secret`, of the training processes, and of those whose
  environment holds it."""
  import threading
  seen, done = {"command line": set(), "trainers": set(), "environment": set()}, \
      threading.Event()

  def watch():
    while not done.is_set():
      for pid in os.listdir("/proc"):
        try:
          with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
          seen["command line"].update([pid] * (secret.encode() in command))
          if b"transformer_jax.main" in command:
            with open(f"/proc/{pid}/environ", "rb") as f:
              seen["environment"].update([pid] * (secret.encode() in f.read()))
            seen["trainers"].add(pid)
        except (OSError, ValueError):
          continue
      time.sleep(0.1)

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  try:
    yield seen
  finally:
    done.set()
    watcher.join()


@pytest.mark.slow
def test_a_storage_password_is_in_no_file_output_or_command_line(tmp_path):
  """A search with its study on the real PostgreSQL server, the URL and its password
  given in $TRANSFORMER_JAX_STORAGE: a launcher here trains the first trial; then on
  SLURM the launcher submits the array job (a stand-in sbatch that keeps the
  environment it got, as SLURM stores it, and runs task 0 in it at once), whose task
  reads the password from ~/.pgpass ($PGPASSFILE) and trains the second; then
  launch.results, a warm start's dry run and a password given in --storage. The
  password is in no output, no file under the root, no process's command line, no
  training process's environment and not in the job's."""
  import pgserver
  server = pgserver.get_server(str(tmp_path / "postgres"), cleanup_mode="stop")
  try:
    secret = "Zq7pW0rdSecret"
    url = server.get_uri().replace("postgres:@", f"postgres:{secret}@")
    code = tmp_path / "code"
    (code / "experiments").mkdir(parents=True)
    for name in ("launch", "transformer_jax", "configs", "pyproject.toml"):
      (code / name).symlink_to(os.path.join(ROOT, name))
    _experiment(code / "experiments", trials="1", pruner='"none"')
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (
        ("python", f'exec {sys.executable} "$@"'),
        ("sbatch", f'env > {tmp_path}/job.env\nSLURM_ARRAY_JOB_ID=77 SLURM_ARRAY_TASK_ID=0 '
                   f'bash "$1" > {tmp_path}/task0.log 2>&1 || exit 1\n'
                   'echo "Submitted batch job 77"')):
      (bin_ / name).write_text(f"#!/bin/bash\n{text}\n")
      (bin_ / name).chmod(0o755)
    (tmp_path / "pgpass").write_text(f"*:*:*:*:{secret}\n")
    (tmp_path / "pgpass").chmod(0o600)
    root = tmp_path / "runs"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", study_lib.STORAGE_ENV: url,
           "PGPASSFILE": str(tmp_path / "pgpass")}
    launch = lambda *flags: subprocess.run(
        [sys.executable, "-m", "launch", "--experiment=experiments/tiny_search.py",
         f"--root={root}", *SMOKE, "--set=train.num_train_steps=20", *flags],
        cwd=code, capture_output=True, text=True, timeout=900, env=env)
    with _processes_watched(secret) as seen:
      here = launch("--target=local")
      assert here.returncode == 0, here.stderr[-2000:]
      # The experiment file, which is code, now asks for a second trial.
      _experiment(code / "experiments", trials="2", pruner='"none"')
      out = launch("--target=slurm", "--noship", f"--repo_dir={code}", "--gpus_per_node=1",
                   "--allow_code_change")
      task = (tmp_path / "task0.log").read_text()
      assert out.returncode == 0 and "Submitted batch job 77" in out.stdout, (
          out.stderr[-2000:], task[-2000:])
      outputs = [here, out, subprocess.run(
          [sys.executable, "-m", "launch.results", "--experiment=experiments/tiny_search.py",
           f"--root={root}", "--smoke"], cwd=code, capture_output=True, text=True,
          timeout=300, env=env)]
      (code / "experiments" / "again.py").write_text(
          (code / "experiments" / "tiny_search.py").read_text())
      outputs.append(subprocess.run(
          [sys.executable, "-m", "launch", "--experiment=experiments/again.py",
           f"--root={root}", *SMOKE, "--set=train.num_train_steps=20", "--dry_run",
           "--warm_start=experiments/tiny_search.py"], cwd=code, capture_output=True,
          text=True, timeout=300, env=env))
    outputs.append(subprocess.run(  # (On its command line, by the user's mistake.)
        [sys.executable, "-m", "launch.results", "--experiment=experiments/tiny_search.py",
         f"--root={root}", "--smoke", f"--storage={url}"], cwd=code, capture_output=True,
        text=True, timeout=300, env=env))
    assert [o.returncode for o in outputs] == [0, 0, 0, 0, 2], [o.stderr[-2000:] for o in outputs]
    assert "# would start from 2 finished trials of experiments/tiny_search.py" in \
        outputs[3].stdout, outputs[3].stdout
    study = study_lib.open_study(sweep.load_experiment(str(code / "experiments/tiny_search.py")),
                                 url, create=False)
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]
    assert all("postgres:***@" in o.stdout + o.stderr for o in outputs)
    assert secret not in "".join(o.stdout + o.stderr for o in outputs) + task
    job = (tmp_path / "job.env").read_text()
    assert secret not in job and study_lib.STORAGE_ENV not in job and "PGPASSFILE=" in job
    written = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "sbatch.sh" for p in written) and len(written) > 10
    assert [p for p in written if secret.encode() in p.read_bytes()] == []
    assert not seen["command line"], "the password was on a command line"
    assert len(seen["trainers"]) >= 2 and not seen["environment"], seen
  finally:
    server.cleanup()


def test_a_gaussian_process_search_draws_each_trial_from_its_seed_and_number():
  """sampler="gp" (Optuna's GPSampler, PyTorch), past its 3 random draws: each trial's
  draw seeded by the search's seed and its number, as TPE's, so the same study from
  scratch draws the same values."""
  import optuna
  spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3),
                              "optimizer.warmup_steps": search.integer(50, 600, log=True)},
                       sampler="gp", sampler_options={"n_startup_trials": 3})
  assert not spec.problems()
  drawn = []
  for _ in range(2):
    study = optuna.create_study(direction=spec.direction)
    for _ in range(6):
      trial = study.ask()
      search._draw(study, trial, spec)
      assert isinstance(study.sampler, optuna.samplers.GPSampler)
      study.tell(trial, (trial.params["model.dropout_rate"] - 0.1) ** 2)
    drawn.append([t.params for t in study.trials])
  assert drawn[0] == drawn[1]  # Seeded by the search's seed and each trial's number.


def test_a_gaussian_process_search_with_a_pruner_is_warned_in_one_line():
  """GPSampler learns from finished trials only: with a pruner, what launch prints of
  the search (every target, dry run included) warns in one line; TPE with a pruner, or
  GP without one, gets no warning."""
  space = {"model.dropout_rate": search.uniform(0.0, 0.3)}
  described = lambda **options: search.describe(sweep.Experiment(
      "x", "x.py", "c", (), "", search.Search(space=space, **options)))
  warnings = lambda **options: [line for line in described(**options).splitlines()
                                if line.startswith("# warning")]
  for pruner in ("successive_halving", "hyperband", "median"):
    assert warnings(sampler="gp", pruner=pruner) == [
        f"# warning: sampler gp learns only from finished trials: the ones the {pruner} "
        'pruner stops teach it nothing (TPE learns from both; or pruner="none")']
  assert warnings(sampler="gp", pruner="none") == warnings(sampler="tpe") == []


@pytest.mark.slow
def test_a_search_starts_from_its_config_and_a_finished_grids_trials_once(tmp_path):
  """start_from_config: the first trial trains the config's own values; --warm_start=
  GRID: the grid's finished trials join the study with their best held-out loss before
  any draw, outside the budget (2 trials: the config's and one drawn), once however
  often the search is launched; a grid value outside the space is refused in one line
  with nothing added."""
  grid = tmp_path / "grid.py"
  grid.write_text('"""A grid."""\nfrom launch import sweep\n'
                  'CONFIG = "configs/transformer.py:numbers"\n'
                  'def trials():\n  return sweep.grid({"model.dropout_rate": [0.0, 0.05]})\n')
  root, steps = tmp_path / "runs", "--set=train.num_train_steps=20"
  out = _launch(f"--experiment={grid}", f"--root={root}", *SMOKE, steps)
  assert out.returncode == 0, out.stderr[-2000:]
  narrow = _experiment(tmp_path, space='{"model.dropout_rate": search.uniform(0.01, 0.3)}')
  refused = _launch(f"--experiment={narrow}", f"--root={root}", f"--warm_start={grid}",
                    *SMOKE, steps)
  errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
  assert refused.returncode == 2 and len(errors) == 1 and (
      f"--warm_start={grid}: trial dropout_rate=0.0's model.dropout_rate=0.0 is outside "
      "the SEARCH space") in errors[0], refused.stderr[-2000:]
  assert not (root / "tiny_search_smoke").exists()

  experiment = _experiment(tmp_path, space='{"model.dropout_rate": search.uniform(0.0, 0.3)}',
                           trials="2", pruner='"none"', start_from_config="True")
  for _ in range(2):
    out = _launch(f"--experiment={experiment}", f"--root={root}", f"--warm_start={grid}",
                  *SMOKE, steps)
    assert out.returncode == 0, out.stderr[-2000:]
  study = study_lib.open_study(sweep.load_experiment(str(experiment)),
                               f"sqlite:///{root}/tiny_search_smoke/study.db", create=False)
  added = [t for t in study.trials if "warm_start" in t.user_attrs]
  assert sorted(t.params["model.dropout_rate"] for t in added) == [0.0, 0.05]
  for trial in added:
    workdir = root / "grid_smoke" / f"dropout_rate={trial.params['model.dropout_rate']}"
    assert trial.value == min(v for _, v in search.evaluations(str(workdir), "eval/loss"))
  first, drawn = [t for t in study.trials if "warm_start" not in t.user_attrs]  # Budget 2.
  assert first.state.name == "COMPLETE" and first.params == {"model.dropout_rate": 0.1}
  assert first.user_attrs["from_config"] and drawn.state.name == "COMPLETE"
  assert len(study.trials) == 4
  rows = results.collect(sweep.load_experiment(str(experiment)), str(root), "eval/loss",
                         True, study)
  assert sorted(r["status"] for r in rows) == [
      "added from grid (--warm_start)"] * 2 + ["complete"] * 2


def _search_trial(study, experiment, root, values: dict, ended: str):
  """A trial of `experiment` ended as a launcher ends it ("done", "pruned" at its first
  evaluation, or "diverged": exit 3), its eval/accuracy `values` by step in its event
  files and its trial.json written, through search.Reporter."""
  from transformer_jax import summaries
  from transformer_jax.training import run_files
  trial = study.ask(experiment.search.distributions())
  trial.set_user_attr("name", search.trial_name(trial.number))
  run = search.trial_run(experiment, str(root), (), False, trial.user_attrs["name"],
                         trial.params)
  trials_lib.record(run, experiment, {})
  writer = summaries.SummaryWriter(run.workdir)
  for step, value in values.items():
    writer.write_scalars(step, {"eval/accuracy": value}, log=False)
  writer.close()
  if ended == "diverged":
    run_files.record_exit(run.workdir, 3, "non-finite loss")
  reporter = search.Reporter(study, trial, experiment.search, run)
  reporter.watch(prune=False)
  reporter.pruned_at = min(values) if ended == "pruned" else None  # As the pruner would.
  assert reporter.end(ended == "done", "") == ended


def test_a_maximized_searchs_best_is_its_highest_in_results_best_txt_and_the_csv(
    tmp_path, monkeypatch, capsys):
  """metric eval/accuracy (higher is better): launch.results lists the finished trial
  with the highest value first and names it best, as best.txt does; the CSV's value
  column holds each finished trial's best evaluation (not its last), a pruned trial's
  last reported one and nothing for a diverged trial, best first."""
  root = tmp_path / "runs"
  path = _experiment(tmp_path, metric='"eval/accuracy"', pruner='"none"')
  experiment = sweep.load_experiment(str(path))
  assert experiment.search.direction == "maximize"
  study = study_lib.open_study(experiment, study_lib.default_storage(experiment, str(root),
                                                                     False))
  for values, ended in (({200: 0.5, 400: 0.7, 600: 0.6}, "done"),
                        ({200: 0.4, 400: 0.9, 600: 0.8}, "done"),
                        ({200: 0.2}, "pruned"), ({200: 0.1}, "diverged"),
                        ({200: 0.3, 400: 0.35, 600: 0.33}, "done")):
    _search_trial(study, experiment, root, values, ended)
  search.write_best(study, experiment, str(root), False)
  best = (root / "tiny_search" / "best.txt").read_text().splitlines()[0]
  assert best == "# best: trial001, eval/accuracy 0.9; trained again by:"

  table = tmp_path / "table.csv"
  # launch.results' main, here: its flags as parsed (a process would spend 15-25 s
  # importing TensorBoard's event reader again).
  monkeypatch.setattr(results, "FLAGS", types.SimpleNamespace(
      experiment=str(path), root=str(root), smoke=False, sort="eval/accuracy",
      csv=str(table), plot=None, curve="eval/loss", storage=None))
  results.main()
  lines = capsys.readouterr().out.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith("trial "))
  assert lines[header + 1].split()[:3] == ["trial001", "complete", "0.9"], lines[header + 1]
  assert best in lines
  rows = list(csv.DictReader(table.read_text().splitlines()))
  value = lambda cell: cell and pytest.approx(float(cell))  # float32 in the event files.
  assert [(r["trial"], r["status"].split(" (")[0], value(r["value"])) for r in rows] == [
      ("trial001", "complete", 0.9), ("trial000", "complete", 0.7),
      ("trial004", "complete", 0.35), ("trial002", "pruned at step 200", 0.2),
      ("trial003", "diverged", "")]


def test_when_every_trial_diverged_the_best_trials_command_says_so(tmp_path):
  """No finished trial, every one diverged: best.txt and the launcher say so in one
  line (how the trials ended, and what to change);
  before any trial has ended, nothing."""
  root = tmp_path / "runs"
  experiment = sweep.load_experiment(str(_experiment(tmp_path, metric='"eval/accuracy"')))
  study = study_lib.open_study(experiment, study_lib.default_storage(experiment, str(root),
                                                                     False))
  assert search.best_again(study, experiment) is None
  for _ in range(2):
    _search_trial(study, experiment, root, {200: 0.1}, "diverged")
  search.write_best(study, experiment, str(root), False)
  note = (root / "tiny_search" / "best.txt").read_text()
  assert note.startswith("# best: none, no trial of tiny_search finished (2 diverged); "
                         "every trial diverged") and note.count("\n") == 1, note


def test_a_launcher_killed_between_the_pruned_marker_and_telling_leaves_no_trial_running(
    tmp_path):
  """Killed after writing WORKDIR/pruned.json and before telling the study: the next
  launcher tells the trial PRUNED (its claim lapsed with its launcher) and draws a new
  one, rather than resuming a pruned run or leaving it RUNNING for ever."""
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  study = study_lib.open_study(experiment, f"sqlite:///{tmp_path / 'study.db'}")
  seen = trial_lease.Seen()
  trial, claim = search.next_trial(study, experiment.search, seen)
  workdir = tmp_path / "runs" / trial.user_attrs["name"]
  workdir.mkdir(parents=True)
  trial.set_user_attr("workdir", str(workdir))
  (workdir / "pruned.json").write_text(json.dumps({"step": 5, "evaluation": 1}))
  claim.release()  # Its launcher stopped: the trial is free.
  following, claim = search.next_trial(study, experiment.search, seen)
  claim.release()
  assert following.number == trial.number + 1
  assert [t.state.name for t in study.trials] == ["PRUNED", "RUNNING"]


def test_a_finished_trials_value_is_its_best_or_its_final_evaluation(tmp_path):
  """trial_value="best" (default): the best of its evaluations; "final": the last."""
  import optuna
  told = {}
  for rule in ("best", "final"):
    spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)},
                         pruner="none", trial_value=rule)
    study = optuna.create_study(direction=spec.direction)
    _, ended = _reported(tmp_path / rule, study, spec, "t", [1.0, 0.5, 0.7], every=10,
                         steps=30)
    assert ended == "done"
    told[rule] = study.trials[0].value
  assert told == {"best": 0.5, "final": pytest.approx(0.7)}


def _fail(study, trial, spec, workdir) -> str:
  """Ends `trial` through search.Reporter as a launcher does after its run crashed."""
  from transformer_jax.training import run_files
  run = trials_lib.Run(sweep.Trial(trial.user_attrs["name"], ()), str(workdir), (
      "--config=configs/transformer.py:numbers",))
  run_files.record_exit(workdir, 1, "a crash")
  return search.Reporter(study, trial, spec, run).end(False, "")


@pytest.mark.parametrize("point", ["before_take", "before_read_back", "before_draw"])
def test_two_launchers_interleaved_anywhere_train_each_trial_alone_with_its_own_values(
    tmp_path, monkeypatch, point):
  """Launcher B's next_trial run whole at a chosen point of each of launcher A's, on one
  SQLite study: before A takes the failed trial0 to retry it, between A writing its hold
  and reading it back, between a trial's ask (or take) and its draw. Each trial is held
  by one launcher at a time, every trial trained has the values drawn for it (the
  retry, its first attempt's), and the budget's 4 trials end."""
  experiment = sweep.load_experiment(str(_experiment(tmp_path, retries="1")))
  spec, url = experiment.search, f"sqlite:///{tmp_path / 'study.db'}"
  studies = {"A": study_lib.open_study(experiment, url),
             "B": study_lib.open_study(experiment, url)}
  seen = {"A": trial_lease.Seen(), "B": trial_lease.Seen()}
  monkeypatch.setattr(trial_lease, "SETTLE_S", 0.0)
  drawn, trained, held = {}, [], {}  # held: number -> (launcher, trial, hold)

  def take(launcher):
    if (taken := search.next_trial(studies[launcher], spec, seen[launcher], wait=False)):
      trial, hold = taken
      assert trial.number not in held, (launcher, trial.number, held)
      assert set(trial.params) == set(spec.space)
      drawn.setdefault(trial.number, trial.params)
      trained.append((trial.number, trial.params))
      held[trial.number] = (launcher, trial, hold)
    return taken

  def end_all():
    for launcher, trial, hold in held.values():
      studies[launcher].tell(trial, 1.0)
      hold.release()
    held.clear()

  first, hold = take("A")
  assert _fail(studies["A"], first, spec, tmp_path / "trial000") == "retried"
  hold.release()
  held.clear()
  module, name = {"before_take": (trial_lease, "take"),
                  "before_read_back": (trial_lease, "settle"),
                  "before_draw": (search, "_draw")}[point]
  original, inside = getattr(module, name), []

  def interleaved(*args, **kwargs):
    if not inside:  # B's calls inside run as they are.
      inside.append("B")
      take("B")
      inside.clear()
    return original(*args, **kwargs)

  monkeypatch.setattr(module, name, interleaved)
  while take("A"):
    end_all()
  inside.append("no more")
  while take("B"):
    end_all()
  end_all()
  assert all(params == drawn[number] for number, params in trained), (trained, drawn)
  assert sorted(number for number, _ in trained) == [0, 0, 1, 2, 3], trained
  assert [t.state.name for t in studies["A"].get_trials()] == ["COMPLETE"] * 4


def test_of_two_launchers_taking_one_free_trial_at_once_one_holds_it(tmp_path):
  """Both saw trial0 free and wrote their hold before either read it back: the one whose
  hold is read back (the later write) holds it, the other does not."""
  experiment = sweep.load_experiment(str(_experiment(tmp_path)))
  url = f"sqlite:///{tmp_path / 'study.db'}"
  first, second = study_lib.open_study(experiment, url), study_lib.open_study(experiment, url)
  trial = first.ask()
  holds = [trial_lease.Hold(study, _handle(study, trial)) for study in (first, second)]
  for hold in holds:
    hold.write()
  assert [hold.ours() for hold in holds] == [False, True]


def _handle(study, trial):
  """`trial` as a launcher with its own handle on the study holds it."""
  import optuna
  return optuna.trial.Trial(study, trial._trial_id)


def test_a_trial_is_resumed_once_its_launcher_is_seen_gone_and_never_waited_for(
    tmp_path, monkeypatch):
  """Liveness from the study alone: a trial held by a launcher on another host is left
  alone while its heartbeat moves, and resumed with its own values once this launcher
  has seen its record unchanged for STALE_S; one held from this host is resumed at once
  when its process is gone, never while it lives. Meanwhile new trials start at once."""
  monkeypatch.setattr(trial_lease, "STALE_S", 1.0)
  monkeypatch.setattr(trial_lease, "SETTLE_S", 0.0)
  experiment = sweep.load_experiment(str(_experiment(tmp_path, trials="8")))
  spec, url = experiment.search, f"sqlite:///{tmp_path / 'study.db'}"
  elsewhere, here = study_lib.open_study(experiment, url), study_lib.open_study(experiment, url)
  gone = subprocess.Popen(["true"])
  gone.wait()
  records = {"remote": {"host": "another-host", "pid": os.getpid(), "beats": 0},
             "dead": {"host": trial_lease.socket.gethostname(), "pid": gone.pid},
             "alive": {"host": trial_lease.socket.gethostname(), "pid": os.getpid()}}
  theirs = {}
  for name, record in records.items():
    trial = elsewhere.ask(spec.distributions())  # As another launcher draws it.
    trial.set_user_attr("name", search.trial_name(trial.number))
    trial.set_user_attr(trial_lease.KEY, record)
    theirs[name] = trial
  seen, took = trial_lease.Seen(), []

  def next_here():
    start = time.monotonic()
    trial, hold = search.next_trial(here, spec, seen, wait=False)
    took.append(trial.number)
    assert trial.params == here.trials[trial.number].params
    assert time.monotonic() - start < 0.9  # Never waits for another launcher's trial.
    here.tell(trial, 1.0)
    hold.release()
    return trial

  assert next_here().number == theirs["dead"].number  # Its process is gone: at once.
  assert next_here().number == 3  # The others may live: a new trial, at once.
  time.sleep(0.6)
  theirs["remote"].set_user_attr(trial_lease.KEY, {**records["remote"], "beats": 1})
  time.sleep(0.6)
  assert next_here().number == 4  # Its heartbeat moved 0.6 s ago: alive.
  time.sleep(1.1)
  resumed = next_here()  # Unchanged for 1.1 s: its launcher is gone.
  assert (resumed.number, resumed.params) == (theirs["remote"].number, theirs["remote"].params)
  assert theirs["alive"].number not in took


def test_a_retried_trials_evaluations_count_once_for_the_pruner(tmp_path):
  """Successive halving keeping 1 in 2 from evaluation 1: trials at 1.0 and 0.9, then
  one at 0.5 that crashes and is retried. It is retried as itself (its number, so its
  Hyperband bracket) and its evaluation stays one value for the pruner: a trial at 0.7,
  the 2nd of 4, is kept (counted twice, 0.5 would make it the 3rd of 5: pruned)."""
  import optuna
  from transformer_jax import summaries
  from transformer_jax.training import run_files
  spec = search.Search(space={"model.dropout_rate": search.uniform(0.0, 0.3)}, retries=1,
                       pruner="successive_halving", first_rung=1, reduction_factor=2)
  study = optuna.create_study(study_name="once",
                              storage=f"sqlite:///{tmp_path / 'study.db'}")
  seen = trial_lease.Seen()

  def attempt(losses, crash=False):
    trial, hold = search.next_trial(study, spec, seen, wait=False)
    workdir = tmp_path / trial.user_attrs["name"]
    writer = summaries.SummaryWriter(workdir)
    for step, loss in losses:
      writer.write_scalars(step, {"eval/loss": loss}, log=False)
    writer.close()
    if crash:
      run_files.record_exit(workdir, 1, "a crash")
    run = trials_lib.Run(sweep.Trial(trial.user_attrs["name"], ()), str(workdir), (
        "--config=configs/transformer.py:numbers", "--config.train.eval_every_steps=10",
        "--config.train.num_train_steps=20"))
    reporter = search.Reporter(study, trial, spec, run)
    reporter.watch()
    ended = reporter.end(not crash, "")
    hold.release()
    return trial.number, reporter.pruned_at, ended

  assert attempt([(10, 1.0), (20, 1.0)])[2] == attempt([(10, 0.9), (20, 0.9)])[2] == "done"
  crashed = attempt([(10, 0.5)], crash=True)
  assert crashed == (2, None, "retried")
  assert attempt([(20, 0.5)]) == (2, None, "done")  # The retry: trial 2 again.
  assert attempt([(10, 0.7), (20, 0.7)]) == (3, None, "done")
  assert [len(t.intermediate_values) for t in study.trials] == [2, 2, 2, 2]
  rung = [t.system_attrs.get("completed_rung_0") for t in study.trials]
  assert rung == pytest.approx([1.0, 0.9, 0.5, 0.7])  # One value each.
