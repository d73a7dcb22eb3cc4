"""A search's study: where it lives (a storage URL, its password never shown), opening
it, the SEARCH it was created with (a changed one refused), and the trials it starts
from (warm starts). launch/search.py runs the search on it."""

from __future__ import annotations

import json
import os
import re
import time

from launch import sweep, trials as trials_lib
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
               allow_change: bool = False):
  """The experiment's study in `storage` (created on first use, its SEARCH stored in
  it; with create=False None where there is none yet, and nothing is written). An
  unreachable storage, or a study created with another SEARCH (unless `allow_change`),
  ends the command in one line."""
  study = _open(experiment, storage, create)
  if create:
    _check_search(study, experiment, storage, allow_change)
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
    if password := password_of(storage):
      reason = reason.replace(password, "***")
    cli.fail(f"--storage={masked(storage)}: cannot open the study there ({reason[:300]})")


def _check_search(study, experiment: sweep.Experiment, storage: str, allow: bool) -> None:
  """Stores the SEARCH in a new study; refuses one created with another (a changed
  space, metric, direction, sampler, pruner or seed) unless `allow`, which stores it."""
  now = json.loads(json.dumps(experiment.search.settings(), default=repr))
  stored = study.user_attrs.get("search")
  if stored is None and study.direction.name.lower() != now["direction"]:
    stored = {"direction": study.direction.name.lower()}  # A study from before.
  if stored == now:
    return
  # A setting the stored SEARCH lacks (added since the study was made) is no change.
  changes = "; ".join(f"{key} {stored[key]!r} -> {now.get(key)!r}"
                      for key in sorted(stored or {}) if stored[key] != now.get(key))
  if changes and not allow:
    cli.fail(f"{experiment.path}: SEARCH differs from the one study {study.study_name!r} "
             f"in {masked(storage)} was created with: {changes}; launch with "
             "--allow_search_change to go on with it, or give the search another "
             "--root or --storage")
  if changes:
    print(f"# SEARCH changed ({changes}); going on with the study (--allow_search_change)")
  study.set_user_attr("search", now)


STORAGE_ENV = "TRANSFORMER_JAX_STORAGE"  # The study's URL, where --storage is not given.


def masked(url: str) -> str:
  """The storage URL as every message shows it: its password as ***."""
  if url.startswith("journal:"):
    return url
  from sqlalchemy.engine import make_url
  try:
    return make_url(url).render_as_string(hide_password=True)
  except Exception:  # Not a URL SQLAlchemy reads: whatever is between : and @ goes.
    return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", url)


def password_of(url: str) -> str | None:
  """The URL's password, or None."""
  from sqlalchemy.engine import make_url
  try:
    return None if url.startswith("journal:") else make_url(url).password or None
  except Exception:
    return None


def resolve_storage(experiment: sweep.Experiment, root: str, smoke: bool, given: str | None,
                    journal: bool = False) -> str:
  """Where the search's study is: `given` (--storage), else $TRANSFORMER_JAX_STORAGE,
  else the storage the search was launched with (ROOT/EXPERIMENT/storage.json, its
  password left out), else the default (default_storage: a journal with `journal`)."""
  if given or os.environ.get(STORAGE_ENV):
    return given or os.environ[STORAGE_ENV]
  record = trials_lib.experiment_dir(experiment, root, smoke) / "storage.json"
  if record.exists():
    url = json.loads(record.read_text())["storage"]
    if password_of(url):
      cli.fail(f"{experiment.name}'s study is in {url} ({record}): put its URL, password "
               f"included, in ${STORAGE_ENV} (or give --storage)")
    return url
  return default_storage(experiment, root, smoke, journal)


def remember_storage(experiment: sweep.Experiment, root: str, smoke: bool,
                     storage: str) -> None:
  """ROOT/EXPERIMENT/storage.json: where the study is, its password masked."""
  record = trials_lib.experiment_dir(experiment, root, smoke) / "storage.json"
  text = json.dumps({"storage": masked(storage)})
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
