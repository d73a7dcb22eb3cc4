"""A trained run, ready for inference: its config, tokenizer and model, its parameters
restored alone (no optimizer state) from a checkpoint, the best one or an average of
several, and ensembles of runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Iterator, Sequence

import flax.linen as nn
import jax
from etils import epath

from transformer_jax import checkpoint, config as config_lib, files, partitioning
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
  return checkpoint.restore_params(mngr, step, abstract), step


class TooFew(ValueError):
  """Fewer checkpoints than --average_last asks for."""


def steps_on_disk(workdir: str, up_to: int | None = None) -> list[int]:
  """The steps of `workdir`'s checkpoints, in order, up to `up_to` (default: all): what
  every average of checkpoints chooses from, `evaluate`'s (`checkpoint_steps`) and a
  run's final evaluation reading its snapshots back (averaging.final_params)."""
  steps = sorted(checkpoint.manager(workdir, 1, read_only=True).all_steps())
  return steps if up_to is None else [s for s in steps if s <= up_to]


def checkpoint_steps(workdir: str, average_last: int = 1, step: int | None = None,
                     at_most: bool = False) -> list[int]:
  """The last `average_last` checkpoint steps of `workdir` up to `step` (default: all);
  with `at_most`, fewer if fewer are there (`evaluate`'s default: the run's
  train.average_last, fewer if fewer are kept)."""
  if average_last < 1:
    raise ValueError(f"--average_last={average_last}: expected 1 or more checkpoints.")
  steps = steps_on_disk(workdir, step)
  upto = f" up to step {step}" if step is not None else ""
  if not steps:
    raise FileNotFoundError(f"No checkpoint in {workdir}/checkpoints{upto}.")
  if len(steps) < average_last and not at_most:
    raise TooFew(f"--average_last={average_last}: {workdir} has only {len(steps)} "
                     f"checkpoints{upto}: {steps}. A run keeps its last "
                     "train.keep_checkpoints, one every train.checkpoint_every_steps: "
                     f"train with --config.train.keep_checkpoints={average_last} or more "
                     "to average that many.")
  return steps[-average_last:]


def averaged_name(stem: str, count: int) -> str:
  """`stem` with `_avg{count}` where `count` checkpoints are averaged: how the
  translations and scores of an average are named, by the run's own final evaluation
  (step_20_avg5.txt) and by `evaluate` (test_avg5)."""
  return f"{stem}_avg{count}" if count > 1 else stem


# Choosing again after a live run deleted a chosen checkpoint: at most this many times.
CHOICES = 5
LEASE = "lock.json"  # What a training run holds while it writes (training/workdir_lock.py).


def chosen_params(trained: TrainedModel, average_last: int = 1,
                  step: int | str | None = None, exact: bool = False
                  ) -> tuple[Any, list[int], str]:
  """The parameters the inference commands' --step and --average_last choose: the best
  checkpoint ("best"), or the average of the last `average_last` up to `step` (with
  `exact`, checkpoint `step` itself); their steps, and what they are in words.

  On a run that is training, the chosen set is read as one: each chosen checkpoint is
  first held by hard links (`_held`), so that the trainer deleting it (its
  train.keep_checkpoints) cannot pull it away mid-read. One deleted before it was held
  is chosen again from what is there now, up to CHOICES times; while the trainer has
  deleted its oldest and not yet committed its newest, so that fewer than
  `average_last` are there, the choice waits for the new one."""
  for attempt in range(1, CHOICES + 1):
    try:
      if step == "best":
        if average_last > 1:
          raise ValueError("--step=best is one checkpoint: it takes no --average_last.")
        params, best = restore_params(trained, "best")
        return params, [best], f"the best checkpoint (step {best})"
      if exact:
        steps = [checkpoint.existing_step(checkpoint.manager(trained.workdir, 1,
                                                             read_only=True), step)]
      else:
        steps = checkpoint_steps(trained.workdir, average_last, step)
      with _held(trained, steps) as view:
        try:
          params = mean(_listed(view, s) for s in steps)
        except RuntimeError:  # Damaged: truly, or deleted while its links were made.
          gone = [s for s in steps if not (checkpoint.directory(trained.workdir) /
                                           str(s)).is_dir()]
          if gone:
            raise checkpoint.Vanished(checkpoint.directory(trained.workdir),
                                      gone[0]) from None
          # Read in place: the error names the run's own checkpoints and an earlier
          # step that reads.
          params = mean(_listed(trained, s) for s in steps)
      return params, steps, (f"checkpoint {steps[0]}" if exact else f"checkpoints {steps}")
    except checkpoint.Vanished as e:
      if attempt == CHOICES:
        raise FileNotFoundError(f"{e}, {CHOICES} times: the run deletes checkpoints "
                                "faster than they are read; try again, or copy them "
                                "first.") from None
      logging.info("%s: choosing again", e)
    except TooFew:
      if attempt == CHOICES or not (epath.Path(trained.workdir) / LEASE).exists():
        raise
      time.sleep(1.0)  # A live run between deleting one checkpoint and adding one.
    except FileNotFoundError as e:
      if e.errno is None or attempt == CHOICES:  # Ours, naming what is missing: said.
        raise
      logging.info("%s vanished while the checkpoints were listed: choosing again",
                   e.filename)
    except NotADirectoryError as e:  # Orbax saw a step's folder, then not (deleted).
      if attempt == CHOICES:
        raise
      logging.info("%s: choosing again", e)
  raise AssertionError("unreachable")


@contextlib.contextmanager
def _held(trained: TrainedModel, steps: Sequence[int]) -> Iterator[TrainedModel]:
  """The run as seen through hard links to its checkpoints `steps`, made in a hidden
  folder of the workdir and removed after: the trainer may delete a checkpoint, the
  links keep its files until the read is done. One deleted before its links were all
  made: Vanished. Where links cannot be made (an object store, a read-only or foreign
  filesystem), and where no run is training (no lease), the run itself."""
  source = checkpoint.directory(trained.workdir)
  if files.is_remote(trained.workdir) or not (epath.Path(trained.workdir) / LEASE).exists():
    yield trained
    return
  try:
    view = tempfile.mkdtemp(prefix=f".reading-{os.getpid()}-", dir=trained.workdir)
  except OSError:  # Read-only: nobody trains it.
    yield trained
    return
  try:
    for step in steps:
      original = os.path.join(source, str(step))
      try:
        for folder, _, names in os.walk(original):
          held = os.path.join(view, "checkpoints", os.path.relpath(folder, source))
          os.makedirs(held, exist_ok=True)
          for name in names:
            os.link(os.path.join(folder, name), os.path.join(held, name))
      except FileNotFoundError:
        pass  # Deleted while being linked: found below.
      if not os.path.isdir(original):
        raise checkpoint.Vanished(source, step)
    yield dataclasses.replace(trained, workdir=view)
  finally:
    shutil.rmtree(view, ignore_errors=True)


def _listed(trained: TrainedModel, step: int) -> Any:
  """The parameters of a checkpoint chosen from a listing: gone since, it Vanished."""
  try:
    return restore_params(trained, step)[0]
  except checkpoint.Vanished:
    raise
  except FileNotFoundError:
    raise checkpoint.Vanished(checkpoint.directory(trained.workdir), step) from None


def accumulate(total: Any, tree: Any) -> Any:
  """`total` + `tree`, element-wise: the one sum of parameters that every average here
  is made of (checkpoints read back, and the training run's window, training/averaging.py),
  so that both give the same bits."""
  return jax.tree.map(lambda t, x: t + x, total, tree)


@jax.jit
def divide(total: Any, count: int) -> Any:
  """The sum of `count` parameter trees made a mean (jitted, so that every average
  divides in the same compiled code)."""
  return jax.tree.map(lambda t: t / count, total)


def mean(trees: Iterator[Any]) -> Any:
  """Element-wise mean of the trees, summed in order then divided, holding two of them
  at a time."""
  total, count = None, 0
  for count, tree in enumerate(trees, start=1):
    total = tree if total is None else accumulate(total, tree)
  return divide(total, count)
