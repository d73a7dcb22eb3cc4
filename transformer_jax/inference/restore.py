"""A trained run, ready for inference: its config, tokenizer and model, its parameters
restored alone (no optimizer state) from a checkpoint, the best one or an average of
several, and ensembles of runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
import orbax.checkpoint as ocp
from etils import epath

from transformer_jax import checkpoint, config as config_lib, partitioning
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.pretokenize import Pretokenizer
from transformer_jax.model.transformer import init_params, Transformer


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """What a training run's workdir holds, apart from the weights."""

  workdir: str
  cfg: config_lib.Config  # With the tokenizer's vocabulary filled in.
  tokenizer: tokenizer_lib.Subwords
  model: Transformer


def load_workdir(workdir: str) -> TrainedModel:
  """The config and tokenizer a run saved in `workdir`, and its model."""
  cfg = config_lib.parse(config_lib.load_workdir_config(workdir))
  tok = tokenizer_lib.load(epath.Path(workdir) / "tokenizer.model", Pretokenizer.of(cfg.data))
  cfg = config_lib.with_vocab(cfg, tok.vocab_size)
  return TrainedModel(workdir, cfg, tok, Transformer(cfg.model))


def load_ensemble(workdirs: Sequence[str]) -> list[TrainedModel]:
  """The runs of an ensemble (one workdir: a single model); they must share a
  tokenizer, and decode with the first run's settings."""
  runs = [load_workdir(w) for w in workdirs]
  first = (epath.Path(runs[0].workdir) / "tokenizer.model").read_bytes()
  for run in runs[1:]:
    if (epath.Path(run.workdir) / "tokenizer.model").read_bytes() != first:
      raise ValueError(f"{run.workdir} has another tokenizer than {runs[0].workdir}: "
                       "an ensemble's models must share one (the same tokenizer.model).")
  return runs


def ensemble(runs: Sequence[TrainedModel], params: Sequence[Any]) -> tuple[Any, Any]:
  """(params, model) for decoding: as they are for one run, tuples for several."""
  if len(runs) == 1:
    return params[0], runs[0].model
  return tuple(params), tuple(run.model for run in runs)


def inference_mesh(cfg: config_lib.Config) -> jax.sharding.Mesh:
  """The run's mesh where this host has several devices; else one device."""
  return partitioning.make_mesh(cfg.train.mesh_shape if jax.device_count() > 1
                                else (1,) * len(config_lib.MESH_AXES))


def parse_step(value: str | None) -> int | str | None:
  """A --step flag: a checkpoint step, "best" (train.keep_best_by's) or None (latest)."""
  if value is None or value == "best":
    return value
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"--step={value!r}: expected a checkpoint step or 'best'.") from None


def restore_params(trained: TrainedModel, step: int | str | None = None
                   ) -> tuple[Any, int]:
  """Parameters of checkpoint `step` (default: the latest; "best": the one that
  train.keep_best_by kept), and that step.

  Only the `params` subtree is read from disk: no optimizer is built and Adam's
  moments (twice the parameters' size) are never loaded.
  """
  mesh = inference_mesh(trained.cfg)
  boxed = jax.eval_shape(lambda rng: init_params(trained.model, rng), jax.random.key(0))
  abstract = checkpoint.abstract_with_shardings(
      nn.meta.unbox(boxed),
      partitioning.logical_shardings(boxed, mesh, trained.cfg.train.logical_axis_rules))
  if step == "best":
    if not trained.cfg.train.keep_best_by:
      raise FileNotFoundError(
          f"--step=best: {trained.workdir} kept no best checkpoint: its config has no "
          "train.keep_best_by (set it, e.g. --config.train.keep_best_by=eval/bleu, when "
          "training; --step=N picks a checkpoint).")
    mngr, step = checkpoint.best_step(trained.workdir, trained.cfg.train.keep_best_by)
  else:
    mngr = checkpoint.manager(trained.workdir, 1, read_only=True)
    step = checkpoint.existing_step(mngr, step)
  item = {"params": abstract}  # The train state's other entries stay on disk.
  args = ocp.args.PyTreeRestore(
      item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)
  return checkpoint.restore(mngr, step, args)["params"], step


def checkpoint_steps(workdir: str, average_last: int = 1,
                     step: int | None = None) -> list[int]:
  """The last `average_last` checkpoint steps of `workdir` up to `step` (default: all)."""
  if average_last < 1:
    raise ValueError(f"--average_last={average_last}: expected 1 or more checkpoints.")
  steps = sorted(checkpoint.manager(workdir, 1, read_only=True).all_steps())
  if step is not None:
    steps = [s for s in steps if s <= step]
  upto = f" up to step {step}" if step is not None else ""
  if not steps:
    raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints{upto}.")
  if len(steps) < average_last:
    raise ValueError(f"--average_last={average_last}: {workdir} has only {len(steps)} "
                     f"checkpoints{upto}: {steps}. A run keeps its last "
                     "train.keep_checkpoints, one every train.checkpoint_every_steps: "
                     f"train with --config.train.keep_checkpoints={average_last} or more "
                     "to average that many.")
  return steps[-average_last:]


def chosen_params(trained: TrainedModel, average_last: int = 1,
                  step: int | str | None = None) -> tuple[Any, list[int], str]:
  """The parameters the inference commands' --step and --average_last choose: the best
  checkpoint ("best"), or the average of the last `average_last` up to `step`; their
  steps, and what they are in words."""
  if step == "best":
    if average_last > 1:
      raise ValueError("--step=best is one checkpoint: it takes no --average_last.")
    params, best = restore_params(trained, "best")
    return params, [best], f"the best checkpoint (step {best})"
  steps = checkpoint_steps(trained.workdir, average_last, step)
  return average_checkpoints(trained, steps), steps, f"checkpoints {steps}"


def average_checkpoints(trained: TrainedModel, steps: Sequence[int]) -> Any:
  """Element-wise mean of the parameters of checkpoints `steps` (the paper averages
  the last 5 for base, 20 for big; Sec. 6.1), as a running mean: two parameter copies
  in memory however many checkpoints are averaged."""
  if not steps:
    raise ValueError("No checkpoints to average.")
  return running_mean(restore_params(trained, step)[0] for step in steps)


def running_mean(trees: Iterator[Any]) -> Any:
  """Element-wise mean of the trees, holding two of them at a time."""
  mean = None
  for n, tree in enumerate(trees, start=1):
    mean = tree if mean is None else jax.tree.map(lambda m, x: m + (x - m) / n, mean, tree)
  return mean


