"""Orbax checkpoints of the train state: save every K steps, keep the last M, resume.

Orbax writes each step into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoints intact; the manager removes
such leftovers when it starts. A checkpoint that cannot be read on resume is moved to
WORKDIR/unreadable_checkpoints/ (kept, not deleted) and the next newest is used.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import jax.experimental.multihost_utils
import orbax.checkpoint as ocp
from etils import epath

from transformer_jax import files


def directory(workdir: epath.PathLike) -> epath.Path:
  """WORKDIR/checkpoints; absolute if local (Orbax needs that), a gs:// URI as given."""
  workdir = os.fspath(workdir)
  return epath.Path(workdir if files.is_remote(workdir) else os.path.abspath(workdir),
                    "checkpoints")


def manager(workdir: epath.PathLike, keep: int, read_only: bool = False
            ) -> ocp.CheckpointManager:
  """Checkpoints live in `workdir/checkpoints/<step>`."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=not read_only,
                                         read_only=read_only,
                                         cleanup_tmp_directories=not read_only)
  return ocp.CheckpointManager(directory(workdir), options=options)


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


def restore(mngr: ocp.CheckpointManager, step: int, args: ocp.args.CheckpointArgs) -> Any:
  """Restores checkpoint `step` as `args` describe (shapes, shardings, which subtree)."""
  try:
    return mngr.restore(step, args=args)
  except Exception as e:  # Orbax raises several types for damaged or mismatched files.
    raise RuntimeError(f"Could not restore checkpoint step {step} from {mngr.directory} "
                       f"(does it match this config's model?): {e}") from e


def restore_state(mngr: ocp.CheckpointManager, abstract_state: Any) -> Any:
  """The newest readable train state, restored into the shapes and shardings given.

  An unreadable checkpoint (truncated or missing files: a damaged disk or copy) is
  reported with its step and the error, moved aside, and the previous one is tried.
  The config check before this (train.check_resume) rules out a model mismatch.
  """
  for step in sorted(mngr.all_steps(), reverse=True):
    try:
      return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # Orbax and TensorStore raise many types for damaged files.
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


def abstract_with_shardings(shapes: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs carrying the target shardings, for restoring in place."""
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)
