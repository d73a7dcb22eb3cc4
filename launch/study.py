"""A search's study: where it lives (one rule: --storage, the experiment's record,
$TRANSFORMER_JAX_STORAGE, the default; its password never shown, never on a command
line, never in a training process's environment), opening it, and what its trials are
(the SEARCH's meaning, their config, the code: another refused). launch/search.py runs
the search on it."""

from __future__ import annotations

import json
import os
import re
import sys
import time

from launch import search_space, sweep, trials as trials_lib
from transformer_jax import cli, files


def default_storage(experiment: sweep.Experiment, root: str, smoke: bool,
                    journal: bool = False) -> str:
  """SQLite in the experiment's folder; with `journal`, a journal file there (for many
  machines appending to it: SQLite's locks do not hold on network filesystems)."""
  folder = os.path.abspath(str(trials_lib.experiment_dir(experiment, root, smoke)))
  if journal:
    return f"journal:{os.path.join(folder, 'study.journal')}"
  return f"sqlite:///{os.path.join(folder, 'study.db')}"


def open_study(experiment: sweep.Experiment, storage: str, create: bool = True,
               allow_change: bool = False, config: dict | None = None,
               code: str | None = None, allow_code_change: bool = False):
  """The experiment's study in `storage` (created on first use, what its trials are
  stored in it: _check_search; with create=False None where there is none yet, and
  nothing is written). An unreachable storage, or a study created with another SEARCH,
  `config` (the trials' resolved config: search.trials_config) or `code` (its
  fingerprint) ends the command in one line unless allowed (`allow_change`: SEARCH
  and config; `allow_code_change`)."""
  study = _open(experiment, storage, create)
  if create:
    now = {"search": experiment.search.settings(study.pruner), "config": config,
           "code": code}
    _check_search(study, experiment, storage, {k: v for k, v in now.items() if v is not None},
                  {"search": allow_change, "config": allow_change, "code": allow_code_change})
  return study


def _open(experiment: sweep.Experiment, storage: str, create: bool):
  import warnings

  import optuna
  optuna.logging.set_verbosity(optuna.logging.WARNING)
  warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
  search = experiment.search
  local = storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else \
      storage.removeprefix("journal:") if storage.startswith("journal:") else None
  try:
    if not create:
      if local and not os.path.exists(local):
        return None
      return optuna.load_study(study_name=experiment.name, storage=_storage(storage))
    if local:
      os.makedirs(os.path.dirname(local), exist_ok=True)
    for attempt in range(3):
      try:
        return optuna.create_study(
            study_name=experiment.name, storage=_storage(storage),
            direction=search.direction, sampler=search.make_sampler(),
            pruner=search.make_pruner(), load_if_exists=True)
      except Exception:  # Two launchers creating a new database's tables at once.
        if attempt == 2:
          raise
        time.sleep(1.0 + attempt)
  except KeyError:  # load_study: the storage has no such study.
    return None
  except Exception as e:  # SQLAlchemy's, the journal's: the reason, in one line.
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cli.fail(f"--storage={masked(storage)}: cannot open the study there "
             f"({hidden(reason, storage)[:300]})")


# What _check_search compares, the flag that lets a launch go on with a change to it.
_ALLOWED_BY = {"search": "--allow_search_change", "config": "--allow_search_change",
               "code": "--allow_code_change"}


def _check_search(study, experiment: sweep.Experiment, storage: str, now: dict,
                  allow: dict) -> None:
  """Stores in a new study what its trials are: the SEARCH's meaning, the config every
  trial trains with but its drawn values (CONFIG and every --set), the code's
  fingerprint. A study created with another of any refuses the launch, one line naming
  each change, exit 2, the study untouched, unless the flag that allows it was given,
  which stores the new one. A setting the stored one lacks (added since) is no change."""
  now = json.loads(json.dumps(now, default=repr))
  stored = {key: study.user_attrs.get(key) for key in now}
  if stored["search"] is None and study.direction.name.lower() != now["search"]["direction"]:
    stored["search"] = {"direction": study.direction.name.lower()}  # A study from before.
  changes = {key: _changes(key, stored[key], now[key]) for key in now if stored[key] is not None}
  refused = [key for key, found in changes.items() if found and not allow[key]]
  lines = [line for found in changes.values() for line in found]
  said = "; ".join(lines[:8] + [f"and {len(lines) - 8} more"] * (len(lines) > 8))
  if refused:
    flags = " and ".join(sorted({_ALLOWED_BY[key] for key in refused}))
    cli.fail(f"{experiment.path}: the search differs from the one study "
             f"{study.study_name!r} in {masked(storage)} was created with: {said}; launch "
             f"with {flags} to go on with it, or give the search another --root or "
             "--storage")
  if said:
    print(f"# the search changed ({said}); going on with the study, which stores the new "
          "one")
  for key, value in now.items():
    if stored[key] != value:
      study.set_user_attr(key, value)


def _changes(key: str, old, new) -> list[str]:
  """Each difference between a stored part (`key`) and the search's, in words."""
  if key == "code":
    return [f"code {old} -> {new}"] * (old != new)
  if key == "search" and isinstance(old.get("sampler"), str):  # Stored as text before.
    old = {k: v for k, v in old.items() if k in ("metric", "direction", "seed", "fixed")}
  if key == "config":
    old, new = {"config": old}, {"config": new}
  out = []
  for name in old:  # A setting added to Search since the study was made is no change.
    if not isinstance(old[name], dict) or not isinstance(new.get(name), dict):
      out += [f"SEARCH {name} {old[name]!r} -> {new.get(name)!r}"] * (old[name] != new.get(name))
      continue
    show = _distribution if name == "space" else repr
    # A path added to the space or the fixed values is a change; a setting (of the
    # sampler's, the config's) added since is not.
    parts = {*old[name], *new[name]} if name in ("space", "fixed") else old[name]
    out += [f"{'SEARCH ' * (key == 'search')}{name} {part}: {show(old[name].get(part))} -> "
            f"{show(new[name].get(part))}" for part in sorted(parts)
            if old[name].get(part) != new[name].get(part)]
  return out


def _distribution(value: dict | None) -> str:
  if value is None:
    return "(none)"
  return search_space.Distribution(**{**value, "values": tuple(value.get("values", ()))}
                                   ).describe()


STORAGE_ENV = "TRANSFORMER_JAX_STORAGE"  # The study's URL, where --storage is not given.


def _mask_netloc(url: str) -> str:
  """Whatever is between the user's : and the host's @ as ***: up to the last @ before
  the path, so that an unescaped @ in the password goes too."""
  return re.sub(r"(//[^/:@]*:)[^/]*@", r"\1***@", url)


def masked(url: str) -> str:
  """The storage URL as every message shows it: its password as ***."""
  if url.startswith("journal:"):
    return url
  from sqlalchemy.engine import make_url
  if url.partition("://")[2].partition("/")[0].count("@") > 1:  # SQLAlchemy would split
    return _mask_netloc(url)  # at the first @ and show the password's end.
  try:
    parsed = make_url(url)
    if "password" in parsed.query:  # libpq's password=, as a query parameter.
      parsed = parsed.update_query_dict({"password": "PASSWORD"})
    return parsed.render_as_string(hide_password=True).replace("password=PASSWORD",
                                                               "password=***")
  except Exception:  # Not a URL SQLAlchemy reads.
    return _mask_netloc(url)


def hidden(text: str, url: str) -> str:
  """`text` with `url`'s password as ***."""
  text = text.replace(url, masked(url))
  password = password_of(url)
  return text.replace(password, "***") if password else text


def keep_secret(url: str) -> None:
  """From here on, a traceback this command prints shows `url`'s password as ***."""
  if masked(url) == url:
    return
  import traceback

  def hook(kind, value, trace):
    sys.stderr.write(hidden("".join(traceback.format_exception(kind, value, trace)), url))
  sys.excepthook = hook


def password_of(url: str) -> str | None:
  """The URL's password, or None."""
  from sqlalchemy.engine import make_url
  try:
    if url.startswith("journal:"):
      return None
    parsed = make_url(url)
    return parsed.password or parsed.query.get("password") or None
  except Exception:
    return None


def without_password(url: str) -> str:
  """The URL without its password (libpq then reads it from ~/.pgpass or $PGPASSWORD)."""
  if not password_of(url):
    return url
  from sqlalchemy.engine import make_url
  parsed = make_url(url).difference_update_query(["password"])
  return parsed._replace(password=None).render_as_string(hide_password=False)  # (A tuple.)


# The variables a password of the study's may be in: the training processes a launcher
# starts, and SLURM jobs (SLURM stores a job's environment), get neither.
SECRETS = (STORAGE_ENV, "PGPASSWORD")


def without_secrets(environ) -> dict:
  """`environ` without the study's URL and password, for the processes that train."""
  return {k: v for k, v in environ.items() if k not in SECRETS}


def resolve_storage(experiment: sweep.Experiment, root: str, smoke: bool, given: str | None,
                    journal: bool = False) -> str:
  """Where the search's study is, by one rule, said in one line (its password masked):
  `given` (--storage, where a password is refused: it would stay in `ps` and the
  shell's history), else where the search was launched (ROOT/EXPERIMENT/storage.json,
  kept without its password: from $TRANSFORMER_JAX_STORAGE when that names the same
  place, else ~/.pgpass or $PGPASSWORD), else $TRANSFORMER_JAX_STORAGE, else the default
  (default_storage: a journal with `journal`)."""
  env = os.environ.get(STORAGE_ENV)
  record = trials_lib.experiment_dir(experiment, root, smoke) / "storage.json"
  if given:
    if password_of(given):
      cli.fail(f"--storage={masked(given)}: a password on the command line stays in `ps` "
               "and the shell's history: give the URL without it and the password in "
               "~/.pgpass (HOST:PORT:DATABASE:USER:PASSWORD, chmod 600) or $PGPASSWORD, "
               f"or the whole URL in ${STORAGE_ENV}")
    url, source = given, "--storage"
  elif record.exists():
    url = without_password(json.loads(record.read_text())["storage"])  # (*** before.)
    env_there = env and without_password(env) == url
    url, source = (env, f"{record}, with ${STORAGE_ENV}'s password") if env_there else (
        url, f"where it was launched: {record}")
  elif env:
    url, source = env, f"${STORAGE_ENV}"
  else:
    url, source = default_storage(experiment, root, smoke, journal), "the default"
  print(f"# {experiment.name}'s study: {masked(url)} ({source})", flush=True)
  keep_secret(url)
  return url


def remember_storage(experiment: sweep.Experiment, root: str, smoke: bool,
                     storage: str) -> None:
  """ROOT/EXPERIMENT/storage.json: where the study is, without its password."""
  record = trials_lib.experiment_dir(experiment, root, smoke) / "storage.json"
  text = json.dumps({"storage": without_password(storage)})
  if not record.exists() or record.read_text() != text:
    record.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(record, text)


def _storage(url: str):
  """A URL for SQLAlchemy, or journal:PATH for a journal file (a shared filesystem)."""
  if url.startswith("journal:"):
    import optuna
    from optuna.storages.journal import JournalFileBackend
    return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
  return url
