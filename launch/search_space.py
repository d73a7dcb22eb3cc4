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
  # A second budget, in device-hours (a trial's devices x its wall time, summed over its
  # trials, retries included): no trial starts once the ended ones reached it, whichever
  # of the two budgets is spent first. None: the trial count alone.
  device_hours: float | None = None
  # Each trial's size in devices (GPUs; TPU chips). None: a whole node each (SLURM: one
  # node's --gpus_per_node; TPU: one --accelerator_type). More than a node's: a trial
  # spans several nodes (16 with --gpus_per_node=8: 2 nodes a trial, one JAX run);
  # fewer: trials share a node, each on devices of its own (1: 8 trials on a node of 8).
  trial_devices: int | None = None
  # SAMPLERS; each trial's draw seeded by `seed` and the trial's number, so a search is
  # reproducible and launchers sharing a study draw apart.
  sampler: str = "tpe"
  pruner: str = "successive_halving"  # PRUNERS.
  seed: int = 0
  retries: int = 1  # A failed trial is trained again at most this many times.
  # The pruners count the metric's own evaluations (a trial's k-th is at step k x
  # train.bleu_every_steps for a BLEU, k x train.eval_every_steps for the loss pass's
  # metrics; its last at train.num_train_steps, where none is pruned): no trial is
  # judged before its `first_rung`-th (successive halving's and Hyperband's first rung,
  # the median rule's warm-up), and each rung keeps 1 in `reduction_factor` trials.
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
    if self.device_hours is not None and not self.device_hours > 0:
      out.append(f"device_hours={self.device_hours}: above 0 (or None: the trial count "
                 "alone)")
    if self.trial_devices is not None and (isinstance(self.trial_devices, bool) or not
                                           isinstance(self.trial_devices, int)
                                           or self.trial_devices < 1):
      out.append(f"trial_devices={self.trial_devices!r}: a whole number of devices, at "
                 "least 1 (or None: a whole node a trial)")
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

  def placement(self, node_devices: int) -> tuple[int, int]:
    """(nodes a trial spans, trials a node holds at once) on nodes of `node_devices`
    devices each; ValueError, naming what would fit, when trial_devices is neither a
    multiple nor a divisor of a node's devices."""
    size = self.trial_devices or node_devices
    if size >= node_devices and size % node_devices == 0:
      return size // node_devices, 1
    if size < node_devices and node_devices % size == 0:
      return 1, node_devices // size
    fits = sorted({d for d in range(1, node_devices + 1) if node_devices % d == 0}
                  | {node_devices * 2, node_devices * 4})
    raise ValueError(f"trial_devices={size} on nodes of {node_devices} devices: a trial "
                     "takes a share of one node or whole nodes; valid: "
                     + ", ".join(map(str, fits)) + ", ...")

  def make_sampler(self, number: int = 0):
    """The sampler that draws trial `number`'s values: seeded by the search's seed and
    that number, so that every trial has a stream of its own."""
    import numpy as np
    import optuna
    seed = int(np.random.SeedSequence([self.seed, number]).generate_state(1)[0])
    sampler = getattr(optuna.samplers, _SAMPLER_CLASSES[self.sampler])
    return sampler(seed=seed, **self.sampler_options)

  def every(self, config) -> int:
    """Steps between two evaluations of the metric in a run of `config`: a BLEU is
    computed by translating (every train.bleu_every_steps), the others by the loss pass
    (every train.eval_every_steps); either also at the last step."""
    train = config.train
    bleu = config_lib.METRICS[self.metric.rsplit("/", 1)[-1]].computed == "bleu"
    return (train.bleu_every_steps if bleu else train.eval_every_steps) or \
        train.num_train_steps

  def evaluations(self, config) -> int:
    """How many evaluations of the metric a full run of `config` has."""
    return -(-config.train.num_train_steps // self.every(config))

  def make_pruner(self, config=None):
    """The pruner for trials of `config`, in the metric's evaluations (the unit the
    trials report in): Hyperband's brackets span a full run's evaluations, known from
    the config before any trial ends (Optuna's "auto" would take them from the first
    trials that end, a diverged one's short life included). Without a config (the
    study's own, made before a trial's config is known, and the search's meaning in
    `settings`), Hyperband's is "auto": no trial is judged by it, as each trial's
    Reporter gives the study the pruner for its own config."""
    import optuna
    p = optuna.pruners
    rungs = {"min_resource": self.first_rung, "reduction_factor": self.reduction_factor}
    full = "auto" if config is None else max(self.evaluations(config), self.first_rung)
    return {"successive_halving": lambda: p.SuccessiveHalvingPruner(**rungs),
            "hyperband": lambda: p.HyperbandPruner(**rungs, max_resource=full),
            "median": lambda: p.MedianPruner(n_warmup_steps=self.first_rung),
            "none": p.NopPruner}[self.pruner]()

  def warnings(self) -> list[str]:
    """What the search does that its author may not expect."""
    if self.sampler == "gp" and self.pruner != "none":
      return [f"sampler gp learns only from finished trials: the ones the {self.pruner} "
              "pruner stops teach it nothing (TPE learns from both; or pruner=\"none\")"]
    return []

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
