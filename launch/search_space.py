"""What a search explores and how (experiments' SEARCH): the space's distributions, the
metric and its direction, the budget, the sampler and the pruner. launch/search.py runs
one."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from transformer_jax import config as config_lib

SAMPLERS = ("tpe", "random", "gp")  # GPSampler needs PyTorch: pip install torch.
PRUNERS = ("successive_halving", "median", "hyperband", "none")


@dataclasses.dataclass(frozen=True)
class Distribution:
  kind: str  # "float", "int" or "choice".
  low: float | int | None = None
  high: float | int | None = None
  log: bool = False
  values: tuple[Any, ...] = ()

  def problem(self) -> str | None:
    """Why these bounds are unusable, or None."""
    if self.kind == "choice":
      return None if self.values else "choice() needs at least one value"
    if not self.low <= self.high:
      return f"low {self.low} is above high {self.high}"
    if self.log and self.low <= 0:
      return f"a log range must be above 0, and this one starts at {self.low}"
    return None

  def optuna(self):
    import optuna.distributions as d
    if self.kind == "choice":
      return d.CategoricalDistribution(self.values)
    if self.kind == "int":
      return d.IntDistribution(int(self.low), int(self.high), log=self.log)
    return d.FloatDistribution(float(self.low), float(self.high), log=self.log)

  def suggest(self, trial, path: str) -> Any:
    """The trial's value for `path`, drawn by its study's sampler (an enqueued trial's
    fixed value, if it has one)."""
    if self.kind == "choice":
      return trial.suggest_categorical(path, self.values)
    if self.kind == "int":
      return trial.suggest_int(path, int(self.low), int(self.high), log=self.log)
    return trial.suggest_float(path, float(self.low), float(self.high), log=self.log)

  def contains(self, value: Any) -> bool:
    if self.kind == "choice":
      return value in self.values
    if self.kind == "int" and (isinstance(value, bool) or value != int(value)):
      return False
    return isinstance(value, (int, float)) and self.low <= value <= self.high

  def value(self) -> dict[str, Any]:
    """The distribution by value, as JSON holds it: its bounds as its kind's numbers."""
    if self.kind == "choice":
      return {"kind": "choice", "values": list(self.values)}
    number = float if self.kind == "float" else int
    return {"kind": self.kind, "low": number(self.low), "high": number(self.high),
            "log": self.log}

  def describe(self) -> str:
    if self.kind == "choice":
      return f"one of {list(self.values)}"
    scale = "log-uniform" if self.log else "uniform"
    return f"{scale} {'integer' if self.kind == 'int' else 'float'} in [{self.low}, {self.high}]"


def uniform(low: float, high: float) -> Distribution:
  return Distribution("float", low, high)


def log_uniform(low: float, high: float) -> Distribution:
  return Distribution("float", low, high, log=True)


def integer(low: int, high: int, log: bool = False) -> Distribution:
  return Distribution("int", low, high, log=log)


def choice(*values: Any) -> Distribution:
  return Distribution("choice", values=tuple(values))


@dataclasses.dataclass(frozen=True)
class Search:
  space: Mapping[str, Distribution]
  metric: str = "eval/loss"  # An eval/ metric (config.METRICS); its direction follows.
  trials: int = 16  # The budget: trials sampled, each counted once (retries are not).
  # SAMPLERS; each trial's draw seeded by `seed` and the trial's number, so a search is
  # reproducible and launchers sharing a study draw apart.
  sampler: str = "tpe"
  pruner: str = "successive_halving"  # PRUNERS.
  seed: int = 0
  retries: int = 1  # A failed trial is trained again at most this many times.
  # The pruners count evaluations (a trial's k-th is at step k x train.eval_every_steps,
  # its last at train.num_train_steps, where none is pruned): no trial is judged before
  # its `first_rung`-th evaluation (successive halving's and Hyperband's first rung, the
  # median rule's warm-up), and each rung keeps 1 in `reduction_factor` trials.
  first_rung: int = 1
  reduction_factor: int = 3
  # The sampler's own settings, by its constructor's names, e.g. {"n_startup_trials": 5}
  # for TPE (Optuna's default, 10 random draws first, is most of a 16-trial budget).
  sampler_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  # A finished trial's value: the "best" of its metric over its evaluations, or its
  # "final" one (the run's last evaluation).
  trial_value: str = "best"
  # The first trial trains the config's own values of the space's fields (the recipe's:
  # a point known to work), then the sampler draws.
  start_from_config: bool = False
  # Config values every trial gets, not searched: e.g. {"train.eval_every_steps": 100},
  # evaluations often enough for the pruner to stop a losing trial early.
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def direction(self) -> str:
    return "minimize" if config_lib.lower_is_better(self.metric) else "maximize"

  def corners(self) -> list[dict[str, Any]]:
    """The space's lowest and its highest values (a choice's first and last)."""
    pick = lambda d, i: d.values[i] if d.kind == "choice" else (d.low, d.high)[i]
    return [{path: pick(d, i) for path, d in self.space.items()} for i in (0, -1)]

  def distributions(self) -> dict:
    return {path: d.optuna() for path, d in self.space.items()}

  def problems(self) -> list[str]:
    """What is wrong with the search itself (not with the config's fields)."""
    out = [f"space: {path}: {problem}" for path, d in self.space.items()
           if (problem := d.problem())]
    if not self.space:
      out.append("space: empty")
    name = self.metric.rsplit("/", 1)[-1]
    if not self.metric.startswith("eval/") or name not in config_lib.METRICS:
      out.append(f"metric={self.metric!r}: the runs log no such held-out metric; valid: "
                 + ", ".join(f"eval/{m}" for m in config_lib.METRICS))
    out += [f"fixed: {path} is also in the space (a field is either searched or fixed)"
            for path in self.fixed if path in self.space]
    if self.trials < 1:
      out.append(f"trials={self.trials}: at least 1")
    if self.sampler not in SAMPLERS:
      out.append(f"sampler={self.sampler!r}; valid: {', '.join(SAMPLERS)}")
    if self.pruner not in PRUNERS:
      out.append(f"pruner={self.pruner!r}; valid: {', '.join(PRUNERS)}")
    if self.retries < 0:
      out.append(f"retries={self.retries}: at least 0")
    if self.trial_value not in ("best", "final"):
      out.append(f"trial_value={self.trial_value!r}; valid: best, final")
    if self.first_rung < 1:
      out.append(f"first_rung={self.first_rung}: at least 1 (evaluations)")
    if self.reduction_factor < 2:
      out.append(f"reduction_factor={self.reduction_factor}: at least 2")
    if self.sampler in SAMPLERS:
      valid = _settings(_SAMPLER_CLASSES[self.sampler])
      unknown = [key for key in self.sampler_options if key not in valid]
      out += [f"sampler_options: {key!r} is not a setting of the {self.sampler} sampler; "
              f"valid: {', '.join(valid) or '(none)'}" for key in unknown]
      if not unknown:
        try:
          self.make_sampler()
        except Exception as e:  # A setting's value Optuna refuses.
          out.append(f"sampler_options={dict(self.sampler_options)}: {e}")
    return out

  def make_sampler(self, number: int = 0):
    """The sampler that draws trial `number`'s values: seeded by the search's seed and
    that number, so that every trial has a stream of its own."""
    import numpy as np
    import optuna
    seed = int(np.random.SeedSequence([self.seed, number]).generate_state(1)[0])
    sampler = getattr(optuna.samplers, _SAMPLER_CLASSES[self.sampler])
    return sampler(seed=seed, **self.sampler_options)

  def make_pruner(self):
    """The pruner, in evaluations (the unit the trials report in)."""
    import optuna
    p = optuna.pruners
    rungs = {"min_resource": self.first_rung, "reduction_factor": self.reduction_factor}
    return {"successive_halving": lambda: p.SuccessiveHalvingPruner(**rungs),
            "hyperband": lambda: p.HyperbandPruner(**rungs),
            "median": lambda: p.MedianPruner(n_warmup_steps=self.first_rung),
            "none": p.NopPruner}[self.pruner]()

  def settings(self, pruner=None) -> dict[str, Any]:
    """What the search means, as stored in its study (a changed one is refused): each
    distribution by value (uniform(0, 0.3) is uniform(0.0, 0.3)), the sampler's and the
    `pruner`'s (default: make_pruner's) settings with Optuna's defaults filled in, so
    that one spelled out at its default is no change."""
    import inspect

    import optuna
    sampler = inspect.signature(getattr(optuna.samplers, _SAMPLER_CLASSES[self.sampler]))
    arguments = sampler.bind(**self.sampler_options)
    arguments.apply_defaults()
    pruner = pruner if pruner is not None else self.make_pruner()
    return {"space": {path: d.value() for path, d in sorted(self.space.items())},
            "metric": self.metric, "direction": self.direction,
            "sampler": {"name": self.sampler, **{k: _plain(v) for k, v in sorted(
                arguments.arguments.items()) if k != "seed"}},
            "pruner": {"name": type(pruner).__name__, **{
                k.lstrip("_"): v for k, v in sorted(vars(pruner).items())
                if isinstance(v, (bool, int, float, str))}},
            "seed": self.seed, "trial_value": self.trial_value,
            "fixed": dict(sorted(self.fixed.items()))}


def _plain(value: Any) -> Any:
  """A setting as JSON holds it: a function by its name (its repr has an address)."""
  if callable(value):
    return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
  return value


# Optuna's class for each sampler name.
_SAMPLER_CLASSES = {"tpe": "TPESampler", "random": "RandomSampler", "gp": "GPSampler"}


def _settings(class_name: str) -> list[str]:
  """The keyword settings of an Optuna sampler (its seed is the search's)."""
  import inspect

  import optuna
  parameters = inspect.signature(getattr(optuna.samplers, class_name)).parameters
  return sorted(name for name in parameters if name not in ("self", "seed"))
