"""Trials of an experiment: named override sets, grids and zips, combined.

An experiment file (experiments/NAME.py) defines CONFIG, the base config such as
"configs/transformer.py:multi30k", and `trials()`, a list built with these helpers (or
SEARCH, an adaptive search, random draws included: launch/search.py):

    sweep.grid({"optimizer.warmup_steps": [400, 800], "model.dropout_rate": [0.1, 0.3]})
    sweep.product(sweep.named(small={...}, large={...}), sweep.zipped({...}))

A trial is a name and {config field path: value}; the launcher turns it into
--config.PATH=VALUE flags and a workdir of its own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import re
import traceback
from typing import Any, Mapping, Sequence

from transformer_jax import cli


@dataclasses.dataclass(frozen=True)
class Trial:
  name: str
  overrides: tuple[tuple[str, Any], ...]  # Sorted (field path, value) pairs.

  @property
  def flags(self) -> list[str]:
    return [f"--config.{path}={format_value(value)}" for path, value in self.overrides]


def format_value(value: Any) -> str:
  """A value as ml_collections' config flags parse it."""
  if isinstance(value, (tuple, list)):
    return "(" + ",".join(format_value(v) for v in value) + ("," if len(value) == 1 else "") + ")"
  if isinstance(value, float):
    return repr(value)
  return str(value)


_NAME_CHARS = "A-Za-z0-9_.,=+-"  # A trial's name is a directory name: nothing else.


def trial_name(overrides: Mapping[str, Any]) -> str:
  """'warmup_steps=400,dropout_rate=0.1': last path parts unless they would clash."""
  last = [path.rsplit(".", 1)[-1] for path in overrides]
  keys = last if len(set(last)) == len(last) else list(overrides)
  text = ",".join(f"{k}={format_value(v)}" for k, v in zip(keys, overrides.values()))
  return re.sub(f"[^{_NAME_CHARS}]", "_", text) or "default"


def _trial(overrides: Mapping[str, Any], name: str | None = None) -> Trial:
  return Trial(name or trial_name(overrides), tuple(overrides.items()))


def named(**trials: Mapping[str, Any]) -> list[Trial]:
  """One trial per keyword: named(baseline={}, deeper={"model.num_encoder_layers": 8})."""
  return [_trial(overrides, name) for name, overrides in trials.items()]


def grid(axes: Mapping[str, Sequence[Any]]) -> list[Trial]:
  """Every combination of the values: the product of the axes."""
  paths = list(axes)
  return [_trial(dict(zip(paths, values))) for values in itertools.product(*axes.values())]


def zipped(axes: Mapping[str, Sequence[Any]]) -> list[Trial]:
  """The i-th values of all axes together; the axes must be of equal length."""
  lengths = {len(v) for v in axes.values()}
  if len(lengths) > 1:
    raise ValueError(f"zipped axes differ in length: { {k: len(v) for k, v in axes.items()} }")
  return [_trial(dict(zip(axes, values))) for values in zip(*axes.values())]


def product(*sweeps: Sequence[Trial]) -> list[Trial]:
  """Every combination of one trial from each sweep, overrides merged, names joined."""
  out = []
  for combo in itertools.product(*sweeps):
    merged: dict[str, Any] = {}
    for trial in combo:
      merged.update(trial.overrides)
    out.append(Trial(",".join(t.name for t in combo), tuple(merged.items())))
  return out


def chain(*sweeps: Sequence[Trial]) -> list[Trial]:
  return [trial for sweep in sweeps for trial in sweep]


@dataclasses.dataclass(frozen=True)
class Experiment:
  name: str
  path: str
  config: str  # "configs/transformer.py:NAME", as for --config.
  trials: tuple[Trial, ...]  # Empty for a search.
  description: str
  search: Any = None  # launch.search.Search, where the file defines SEARCH instead.


def load_experiment(path: str) -> Experiment:
  """Imports experiments/NAME.py and checks its trials (unique, non-empty names)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"No experiment file {path}.")
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"experiment_{name}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "CONFIG"):
      raise ValueError("it must define CONFIG (see launch/sweep.py)")
    search = getattr(module, "SEARCH", None)
    if hasattr(module, "trials") == (search is not None):
      raise ValueError("it must define either trials(), a list of trials (launch/sweep.py),"
                       " or SEARCH, a search (launch/search.py)")
    if search is not None and type(search).__name__ != "Search":
      raise ValueError(f"SEARCH must be a launch.search.Search, not {type(search).__name__}")
    trials = tuple(module.trials()) if search is None else ()
  except Exception as e:  # The file's own mistake, named with its line.
    raise ValueError(f"{path}{_line_in(e, path)}: {type(e).__name__}: {e}") from e
  config_file = str(module.CONFIG).split(":")[0]
  if not os.path.exists(config_file):
    raise ValueError(f"{path}: CONFIG={module.CONFIG!r} names no file {config_file} "
                     f"(relative to {os.getcwd()}).")
  names = [t.name for t in trials]
  for bad in [n for n in names if not re.fullmatch(f"[{_NAME_CHARS}]+", n) or set(n) == {"."}]:
    raise ValueError(f"{path}: trial name {bad!r} is not a plain directory name: use "
                     "letters, digits and _.,=+- only (each trial runs in ROOT/"
                     "EXPERIMENT/TRIAL and must stay inside ROOT).")
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if search is None and (not trials or duplicates):
    raise ValueError(f"{path}: {'no trials' if not trials else f'duplicate trial names {duplicates}'}.")
  return Experiment(name, path, module.CONFIG, trials, (module.__doc__ or "").strip(),
                    search)


def _line_in(error: Exception, path: str) -> str:
  """':LINE' of the innermost frame of `error` inside the file `path` (or '')."""
  if isinstance(error, SyntaxError) and error.lineno:
    return f":{error.lineno}"
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(f.filename) == os.path.abspath(path)]
  return f":{frames[-1].lineno}" if frames else ""


def load_experiment_or_exit(path: str) -> Experiment:
  """load_experiment for command lines: a bad file ends the program with its reason."""
  try:
    return load_experiment(path)
  except (FileNotFoundError, ValueError) as e:
    cli.fail(str(e))
