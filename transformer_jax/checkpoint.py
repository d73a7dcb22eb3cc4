"""Orbax checkpoints of the train state: save every K steps, keep the last M, resume.

Orbax writes each step into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoints intact; the manager removes
such leftovers when it starts. A checkpoint that cannot be read on resume is moved to
WORKDIR/unreadable_checkpoints/ (kept, not deleted) and the next newest is used.
Before resuming, `check_resume` compares the new config with the one the workdir's
checkpoints were made with, and says which changes it allows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
from typing import Any

import jax
import jax.experimental.multihost_utils
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax.training import train_state

from transformer_jax import config as config_lib, files


def directory(workdir: epath.PathLike) -> epath.Path:
  """WORKDIR/checkpoints; absolute if local (Orbax needs that), a gs:// URI as given."""
  workdir = os.fspath(workdir)
  return epath.Path(workdir if files.is_remote(workdir) else os.path.abspath(workdir),
                    "checkpoints")


class WithAverage(train_state.TrainState):
  """A train state saved inside the averaging window, with the running sum of the
  snapshots' parameters and their steps (training/averaging.py). On disk the state's
  entries keep their names, so its parameters read as any checkpoint's."""

  average_sum: Any = None  # Shaped as `params`.
  average_steps: Any = None  # int32 [snapshots summed]


def with_saved_average(abstract_state: Any, saved: dict[str, tuple[int, ...]]) -> Any:
  """`abstract_state`, with the running sum where checkpoint `saved` holds one."""
  if "average_steps" not in saved:
    return abstract_state
  steps = jax.ShapeDtypeStruct(saved["average_steps"], np.int32,
                               sharding=abstract_state.step.sharding)
  return WithAverage(**{f.name: getattr(abstract_state, f.name)
                        for f in dataclasses.fields(abstract_state)},
                     average_sum=abstract_state.params, average_steps=steps)


class DiskFull(Exception):
  """A save ran out of space; the checkpoints before it are intact."""


def disk_full(workdir: epath.PathLike, step: int, error: BaseException | str) -> DiskFull:
  """A DiskFull naming the step being saved, the path and the last good checkpoint."""
  path = directory(workdir)
  saving = re.search(r"/(\d+)\.orbax-checkpoint-tmp", str(error))
  last = max((int(p.name) for p in path.iterdir() if p.name.isdigit()), default=None) \
      if path.exists() else None
  return DiskFull(
      f"no space left on the device of {path} to save step "
      f"{saving.group(1) if saving else step}"
      + (f" ({error})" if isinstance(error, str) else "") + "; the last good checkpoint "
      + (f"is step {last} ({path / str(last)})" if last is not None else "is none")
      + ". Free space (or raise the quota), then run the same command to resume from it.")


def check_space(workdir: epath.PathLike, step: int, state: Any) -> None:
  """Raises DiskFull before a save that a local disk has no room for (Orbax's writer
  threads would fail one array at a time). Buckets are not checked: their quota errors
  end the run with the same DiskFull, from the save itself."""
  path = directory(workdir)
  if files.is_remote(path):
    return
  needed = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) * 1.05
  free = shutil.disk_usage(path).free
  full = np.array([free < needed])
  if jax.process_count() > 1:  # Every process stops, or none.
    full = jax.experimental.multihost_utils.process_allgather(full)
  if full.any():
    raise disk_full(workdir, step, f"needs about {needed / 1e6:.1f} MB, "
                    f"{free / 1e6:.1f} MB free")


def manager(workdir: epath.PathLike, keep: int, read_only: bool = False,
            keep_best_by: str = "") -> ocp.CheckpointManager:
  """Checkpoints live in `workdir/checkpoints/<step>`. Kept: the last `keep`, and with
  `keep_best_by` (a metric) also the one saved with its best value (orbax's
  preservation policies: LatestN or BestN; see early_stopping.py)."""
  options: dict[str, Any] = dict(create=not read_only, read_only=read_only,
                                 cleanup_tmp_directories=not read_only)
  if keep_best_by:
    lower = config_lib.lower_is_better(keep_best_by)
    worst = float("inf") if lower else float("-inf")  # Saved with no or another metric.
    value = lambda metrics: metrics.get(keep_best_by, worst)
    # With a best_fn orbax writes each save's metrics and ranks them (best_step).
    options.update(best_fn=value, best_mode="min" if lower else "max")
    if not read_only:
      best = ocp.checkpoint_managers.BestN(get_metric_fn=value, reverse=lower, n=1,
                                           keep_checkpoints_without_metrics=False)
      options["preservation_policy"] = ocp.checkpoint_managers.AnyPreservationPolicy(
          [ocp.checkpoint_managers.LatestN(keep), best])
  elif not read_only:
    options["max_to_keep"] = keep
  return ocp.CheckpointManager(directory(workdir),
                               options=ocp.CheckpointManagerOptions(**options))


def best_step(workdir: epath.PathLike, metric: str) -> tuple[ocp.CheckpointManager, int]:
  """The manager and step of the checkpoint saved with the best value of `metric`
  (train.keep_best_by's). A run from before the best checkpoint joined checkpoints/
  kept it in WORKDIR/best/<step>, which is read until a checkpoint has the metric."""
  mngr = manager(workdir, 1, read_only=True, keep_best_by=metric)
  step = mngr.best_step()
  if step is not None and metric in (mngr.metrics(step) or {}):
    return mngr, step
  earlier = epath.Path(workdir) / "best"
  if earlier.is_dir():
    options = ocp.CheckpointManagerOptions(create=False, read_only=True)
    earlier_mngr = ocp.CheckpointManager(earlier, options=options)
    return earlier_mngr, existing_step(earlier_mngr)
  raise FileNotFoundError(f"No checkpoint in {mngr.directory} was saved with {metric} "
                          "(train.keep_best_by): the run has not evaluated it yet.")


def existing_step(mngr: ocp.CheckpointManager, step: int | None = None) -> int:
  """`step` (default: the latest) if it was checkpointed; else FileNotFoundError naming
  the directory and the steps that exist."""
  steps = mngr.all_steps()
  if step is None:
    step = mngr.latest_step()
  if step is None or step not in steps:
    raise FileNotFoundError(
        f"No checkpoint {'' if step is None else f'for step {step} '}in {mngr.directory}; "
        f"available steps: {sorted(steps) or 'none'}.")
  return step


class Vanished(FileNotFoundError):
  """A checkpoint that was listed is gone: the run training in the workdir deleted it
  (train.keep_checkpoints) while it was being read."""

  def __init__(self, checkpoints: epath.PathLike, step: int):
    super().__init__(f"checkpoint step {step} in {checkpoints} was deleted while it was "
                     "read (a run is training there)")


def restore(mngr: ocp.CheckpointManager, step: int, args: ocp.args.CheckpointArgs) -> Any:
  """Restores checkpoint `step` as `args` describe (shapes, shardings, which subtree).
  One that is no longer there raises Vanished (a live run deleted it: choose again).
  One it cannot read raises RuntimeError in one line naming the newest earlier step
  that reads (moves nothing: inference may read a run another process trains)."""
  try:
    return mngr.restore(step, args=args)
  except Exception as e:  # Orbax and TensorStore raise many types for damaged files.
    error = e
  if not (epath.Path(mngr.directory) / str(step)).exists():
    raise Vanished(mngr.directory, step) from None
  intact = None
  for earlier in sorted((s for s in mngr.all_steps() if s < step), reverse=True):
    try:
      mngr.restore(earlier, args=args)
    except Exception:
      continue
    intact = earlier
    break
  raise RuntimeError(
      f"checkpoint step {step} in {mngr.directory} cannot be read: it is damaged or "
      f"incomplete ({type(error).__name__}: {' '.join(str(error).split())[:200]}). "
      + (f"Step {intact} reads: pass --step={intact} to use it." if intact is not None
         else "No earlier checkpoint reads either.")) from None


def restore_params(mngr: ocp.CheckpointManager, step: int, abstract: Any) -> Any:
  """The parameters alone of checkpoint `step`, into `abstract`'s shapes and shardings:
  the train state's other entries (Adam's moments, twice their size) stay on disk."""
  item = {"params": abstract}
  args = ocp.args.PyTreeRestore(
      item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
      partial_restore=True)
  return restore(mngr, step, args)["params"]


def restore_state(mngr: ocp.CheckpointManager, abstract_state: Any) -> Any:
  """The newest readable train state, restored into the shapes and shardings given (a
  WithAverage where the checkpoint holds the averaging window's sum).

  An unreadable checkpoint (truncated or missing files: a damaged disk or copy) is
  reported with its step and the error, moved aside, and the previous one is tried.
  One whose arrays have other shapes than `abstract_state`'s was made with another
  model: InputError, nothing moved.
  """
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      saved = saved_shapes(mngr, step)
    except Exception as e:  # Orbax and TensorStore raise many types for damaged files.
      _set_aside(mngr, step, e)
      continue
    abstract = with_saved_average(abstract_state, saved)
    if mismatches := shape_mismatches(saved, abstract):
      raise mismatch_error(mngr, step, mismatches)  # Another model: not damage.
    try:
      return mngr.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as e:
      _set_aside(mngr, step, e)
  raise FileNotFoundError(f"No readable checkpoint in {mngr.directory}.")


def _set_aside(mngr: ocp.CheckpointManager, step: int, error: Exception) -> None:
  """Moves the unreadable checkpoint `step` out of the manager's sight, keeping it."""
  source = epath.Path(mngr.directory) / str(step)
  target = epath.Path(mngr.directory).parent / "unreadable_checkpoints" / str(step)
  if jax.process_index() == 0:
    target.parent.mkdir(parents=True, exist_ok=True)
    source.rename(target)
  jax.experimental.multihost_utils.sync_global_devices(f"set_aside_{step}")
  mngr.reload()
  first = " ".join(str(error).split())[:300]
  logging.error("checkpoint step %d is corrupt or incomplete and cannot be read (%s: %s); "
                "moved it to %s and falling back to the previous checkpoint.", step,
                type(error).__name__, first, target)


def _name(path: tuple) -> str:
  """A pytree path as a/b/0/c, the same for a saved tree's metadata and a live state."""
  return "/".join(str(next(getattr(k, a) for a in ("key", "name", "idx", "attr")
                           if hasattr(k, a))) for k in path)


def saved_shapes(mngr: ocp.CheckpointManager, step: int) -> dict[str, tuple[int, ...]]:
  """Every array of checkpoint `step` by name, with its shape, from the metadata alone
  (no array is read). Raises if the metadata cannot be read (a damaged checkpoint)."""
  path = epath.Path(mngr.directory) / str(step) / "default"
  metadata = ocp.StandardCheckpointer().metadata(path)
  tree = getattr(metadata, "item_metadata", metadata)
  shapes = {_name(p): tuple(leaf.shape)
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  if not shapes:  # Orbax answers a damaged array store with no arrays.
    raise ValueError(f"no array metadata can be read in {path}")
  return shapes


def shape_mismatches(saved: dict[str, tuple[int, ...]], abstract_state: Any) -> list[str]:
  """The arrays whose shapes differ between a checkpoint (`saved_shapes`) and the state
  a config builds, or that only one of them has: 'params/embed/embedding: (100, 32) in
  the checkpoint, (100, 64) with this config'."""
  expected = {_name(p): tuple(x.shape)
              for p, x in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
  shown = lambda shape: "absent" if shape is None else str(shape)
  return [f"{name}: {shown(saved.get(name))} in the checkpoint, "
          f"{shown(expected.get(name))} with this config"
          for name in sorted(saved.keys() | expected.keys(),
                             key=lambda n: (not n.startswith("params/"), n))
          if saved.get(name) != expected.get(name)]


def mismatch_error(mngr: ocp.CheckpointManager, step: int, mismatches: list[str]
                   ) -> config_lib.InputError:
  """One line: the checkpoint was made with another model than the config's."""
  more = f"; and {len(mismatches) - 3} more" if len(mismatches) > 3 else ""
  return config_lib.InputError(
      f"checkpoint step {step} in {mngr.directory} was made with another model than this "
      f"config's: {'; '.join(mismatches[:3])}{more}. Use the config it was trained with "
      "(model.* and data.vocab_size), or a new --workdir; nothing was changed.")


def abstract_with_shardings(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the target shardings, for restoring in place."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def config_changes(saved: config_lib.Config, new: config_lib.Config) -> tuple[list[str], list[str]]:
  """The fields that differ, as (incompatible with resuming, compatible) descriptions."""
  incompatible, compatible = [], []
  for section in dataclasses.fields(saved):
    old_section, new_section = getattr(saved, section.name), getattr(new, section.name)
    for f in dataclasses.fields(old_section):
      a, b = getattr(old_section, f.name), getattr(new_section, f.name)
      if a != b:
        allowed = f.metadata.get("resumable", False)  # config.field(..., resumable=True).
        if f.name == "grad_clip_norm" and (a > 0) != (b > 0):
          allowed = False  # Clipping on or off changes the optimizer state's structure.
        if f.name == "tfds_name" and a == b.split(":")[0]:
          allowed = True  # The version now pinned: the one the run read (its only one).
        (compatible if allowed else incompatible).append(
            f"{section.name}.{f.name}: {a!r} -> {b!r}")
  return incompatible, compatible


def check_resume(cfg: config_lib.Config, workdir: str) -> list[str]:
  """Compares `cfg` with the config a previous run saved in `workdir` (if it left
  checkpoints or a tokenizer); returns the compatible changes, raises InputError on
  the others."""
  saved_path = epath.Path(workdir) / "config.json"
  checkpoints = directory(workdir)
  has_state = (epath.Path(workdir) / "tokenizer.model").exists() or (
      checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir()))
  if not (saved_path.exists() and has_state):
    return []
  try:
    saved = config_lib.parse(config_lib.load_workdir_config(workdir))
  except ValueError as e:
    raise config_lib.InputError(f"{saved_path} is not a valid config ({e}); use a new "
                                "workdir or restore that file.") from e
  incompatible, compatible = config_changes(saved, cfg)
  if incompatible:
    raise config_lib.InputError(
        f"{workdir} holds a run with a different config, which its checkpoints and "
        f"tokenizer were made with: {'; '.join(incompatible)}. Use a new --workdir, or "
        f"the saved values (see {saved_path}).")
  return compatible
