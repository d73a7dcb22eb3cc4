"""Typed, frozen configuration for the library: `Config`, its five sections
(sections.py) and how a field is declared and checked (fields.py).

The ml_collections ConfigDict that the command line builds stops at the top of
`loop.train_and_evaluate`; everything below it receives these dataclasses, so a
typo or an out-of-range value fails at start-up, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any, Mapping, TypeVar

import ml_collections
from etils import epath

# The package's names in one namespace: config_lib.ModelConfig, config_lib.METRICS, ...
from transformer_jax.config.fields import (ACTIVATIONS, BATCHING,
                                           DEFAULT_LOGICAL_AXIS_RULES, DTYPES, EOS_ID,
                                           field, InputError, KEEP_BEST_BY,
                                           KERNEL_CHOICES, lower_is_better, MESH_AXES,
                                           Metric, METRICS, NotPrepared, PAD_ID, PRETOKENIZERS,
                                           RNG_IMPLS, round_up, TOKENIZER_TYPES,
                                           UNK_ID, check as _check)
from transformer_jax.config.sections import (ATTENTION, DATASETS, DataConfig, DecodeConfig,
                                             ModelConfig, OptimizerConfig, TrainConfig)

T = TypeVar("T")


def _name_unknown(names, valid, prefix: str) -> str:
  """The names not in `valid`, each with the closest valid name, if any; "" if none."""
  said = []
  for name in sorted(set(names) - set(valid)):
    close = difflib.get_close_matches(name, valid, n=1)
    said.append(prefix + name + (f' (did you mean "{close[0]}"?)' if close else ""))
  return ", ".join(said)


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything `train_and_evaluate` needs, typed. Every default lives in the section
  dataclasses above (the paper's base model on WMT14 EN-DE); configs/transformer.py
  writes only what each named config changes."""

  # Made when a Config is, not when this module is imported: DataConfig's check imports
  # the dataset it names, whose module imports the data package (which imports this).
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)

  def __post_init__(self):
    longest = self.data.max_length + self.decode.max_extra_length
    _check(self.model.max_len >= longest, "model.max_len", self.model.max_len,
           f">= data.max_length + decode.max_extra_length = {self.data.max_length} + "
           f"{self.decode.max_extra_length} = {longest} (positions past max_len have no "
           "encoding)")
    _check(self.train.loss_kernel == "xla" or not self.model.logits_bias,
           "train.loss_kernel", self.train.loss_kernel,
           "'xla' with model.logits_bias=True (the fused kernel has no logits bias)")


_CLASSES = {f.name: f.default_factory for f in dataclasses.fields(Config)}
# Filled in by the run, never set by a user.
_DERIVED = {"model": {"vocab_size"}}


def defaults() -> ml_collections.ConfigDict:
  """The default config as a ConfigDict: every field a command line can override."""
  return ml_collections.ConfigDict({
      section: {f.name: getattr(getattr(Config(), section), f.name)
                for f in dataclasses.fields(cls) if f.name not in _DERIVED.get(section, ())}
      for section, cls in _CLASSES.items()})


def from_mapping(cls: type[T], section: str, values: Mapping[str, Any]) -> T:
  """Builds dataclass `cls` from a config section, naming any unknown field."""
  valid = {f.name for f in dataclasses.fields(cls)} - _DERIVED.get(section, set())
  unknown = _name_unknown(values, valid, f"config.{section}.")
  if unknown:
    raise InputError(f"Unknown field(s) {unknown}; valid fields of config.{section}: "
                     f"{', '.join(sorted(valid))}.")
  return cls(**dict(values))


def parse(config: Mapping[str, Any]) -> Config:
  """Validates a ConfigDict (or plain dict) and returns the typed configuration."""
  unknown = _name_unknown(config, _CLASSES, "")
  if unknown:
    raise InputError(f"Unknown config section(s) {unknown}; valid: {', '.join(_CLASSES)}.")
  return Config(**{section: from_mapping(cls, section, config.get(section, {}))
                   for section, cls in _CLASSES.items()})


def with_vocab(cfg: Config, vocab_size: int) -> Config:
  """`cfg` with the model's vocabulary set to the tokenizer's size."""
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab_size))


def with_epochs(cfg: Config, steps_per_epoch: int) -> Config:
  """`cfg` with train.eval_every_epochs and train.checkpoint_every_epochs, where set,
  turned into the step cadences they mean: an epoch is `steps_per_epoch` steps."""
  train = cfg.train
  steps = {f"{name}_every_steps": getattr(train, f"{name}_every_epochs") * steps_per_epoch
           for name in ("eval", "checkpoint") if getattr(train, f"{name}_every_epochs")}
  return dataclasses.replace(cfg, train=dataclasses.replace(train, **steps))


def load_workdir_config(workdir: str) -> ml_collections.ConfigDict:
  """The resolved config a training run saved as WORKDIR/config.json."""
  path = epath.Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: is {workdir} the workdir of a training run?")
  try:
    return ml_collections.ConfigDict(json.loads(path.read_text()))
  except (ValueError, UnicodeDecodeError) as e:  # Truncated or overwritten.
    raise ValueError(
        f"{path} is damaged ({e}): restore it from a copy, or write it anew from the "
        "run's config: python -m transformer_jax.main --config=... --print_config > "
        f"{path} (a training run with the right config also resumes without it).") from None


def field_reference() -> str:
  """Every config field with its default, whether a resume may change it and its
  meaning, as Markdown: docs/config.md is this text."""
  out = ["# Config fields", "",
         "Every field of `config.<section>.<field>`, with its default (the paper's base",
         "model where the paper says) and its meaning. Generated from",
         "`transformer_jax/config/` by `python -m transformer_jax.config`; configs in",
         "`configs/` change some defaults, and `main --print_config` shows a resolved one.",
         "A run resumed with a changed field goes on only where `resume` says yes; any",
         "other change would not match its checkpoints, and the run refuses to start."]
  for section, cls in _CLASSES.items():
    out += ["", f"## `{section}`", "", "| field | default | resume | meaning |",
            "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
      if "doc" not in f.metadata:
        continue  # model.vocab_size: filled in from the tokenizer, not a config field.
      default = repr(f.default)
      default = f"`{default}`" if len(default) <= 40 else "(long: see config/sections.py)"
      resume = "yes" if f.metadata["resumable"] else ""
      out.append(f"| `{f.name}` | {default} | {resume} | {f.metadata['doc'].replace('|', '/')} |")
  return "\n".join(out) + "\n"


